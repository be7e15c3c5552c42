"""Engine settings: the operator's file loads as written, and every bad value is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from batching_engine.config import ConfigError, EngineConfig, engine_config, read_serving_file
from infergrid.serving_config import ModelRef, ServingFile


def serving_doc(**engine: Any) -> dict[str, Any]:
    """What `render.engine_config` writes for an InferenceService."""
    return {
        "version": "v1",
        "port": 8000,
        "model": {"name": "tiny", "storageUri": "pkg://llm-tiny", "format": "safetensors",
                  "task": "text-generation"},
        "engine": engine,
    }  # fmt: skip


def load(tmp_path: Path, doc: object) -> tuple[ServingFile, EngineConfig]:
    """The file as the engine reads it at start, and its batching limits without flags."""
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(doc))
    served = read_serving_file(path)
    return served, engine_config(served.engine, {})


@pytest.mark.parametrize(
    ("asked", "device", "budget"),
    [({}, "cpu", 512), ({}, "cuda", 4096), ({"max_num_seqs": 1024}, "cpu", 1024),
     ({"max_num_batched_tokens": 128}, "cuda", 128),
     ({"max_num_batched_tokens": 8192}, "cpu", 8192)],
)  # fmt: skip
def test_a_step_budget_left_at_0_is_the_devices_and_fits_every_decode(asked, device, budget):
    config = EngineConfig(**asked).for_device(device)
    assert config.max_num_batched_tokens == budget
    assert config.for_device(device) == config


def test_a_step_budget_given_is_held_to_the_decodes_it_must_fit():
    with pytest.raises(ConfigError) as caught:
        EngineConfig(max_num_seqs=256, max_num_batched_tokens=128)
    assert "max_num_batched_tokens" in str(caught.value)
    EngineConfig(max_num_seqs=256)  # 0: the device's, raised to fit (above)


def test_defaults_match_the_crd():
    config = EngineConfig()
    assert (config.max_num_seqs, config.max_num_batched_tokens, config.max_model_len) == (
        64, 0, 2048,
    )  # fmt: skip
    assert (config.block_size, config.max_queue_size, config.queue_timeout_s) == (16, 256, 60.0)
    assert config.enable_prefix_caching and config.priority_levels == 2
    assert (config.max_batch_size, config.preferred_batch_sizes, config.max_queue_delay_ms) == (
        32, (), 5,
    )  # fmt: skip


def test_operator_file_loads(tmp_path):
    doc = serving_doc(maxNumSeqs=8, maxNumBatchedTokens=512, maxModelLen=1024, blockSize=32,
                      maxBatchSize=4, maxQueueDelayMs=0, maxQueueSize=10,
                      image="x/engine:1")  # fmt: skip
    served, engine = load(tmp_path, doc)
    assert served.model == ModelRef("tiny", "pkg://llm-tiny", "safetensors", "text-generation")
    assert served.port == 8000
    assert engine == EngineConfig(
        max_num_seqs=8, max_num_batched_tokens=512, max_model_len=1024, block_size=32,
        max_batch_size=4, max_queue_delay_ms=0, max_queue_size=10,
    )  # fmt: skip


def test_engine_section_and_model_defaults_are_optional(tmp_path):
    doc = {"version": "v1", "model": {"name": "m", "storageUri": "hf://org/m"}}
    served, engine = load(tmp_path, doc)
    assert engine == EngineConfig()
    assert (served.model.format, served.model.task, served.port) == (
        "huggingface", "text-generation", 8000,
    )  # fmt: skip


def test_engine_only_settings_load(tmp_path):
    doc = serving_doc(queueTimeoutSeconds=2.5, enablePrefixCaching=False, priorityLevels=3,
                      preferredBatchSizes=[4, 8])  # fmt: skip
    _, engine = load(tmp_path, doc)
    assert engine.queue_timeout_s == 2.5 and not engine.enable_prefix_caching
    assert engine.priority_levels == 3 and engine.preferred_batch_sizes == (4, 8)


def test_the_gpu_memory_utilization_comes_from_the_file_and_a_flag_overrides_it(tmp_path):
    """Two engines on one time-sliced GPU: the CRD's spec.engine.gpuMemoryUtilization reaches
    the file the operator writes; the flag still wins for a hand-run engine."""
    served, engine = load(tmp_path, serving_doc(gpuMemoryUtilization=0.45))
    assert engine.gpu_memory_utilization == 0.45
    flagged = engine_config(served.engine, {"gpu_memory_utilization": 0.3})
    assert flagged.gpu_memory_utilization == 0.3
    assert EngineConfig().gpu_memory_utilization == 0.9


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        ({"maxNumSeqs": 0}, "engine.maxNumSeqs: must be an integer from 1 to 4096, got 0"),
        ({"maxNumSeqs": "8"}, "engine.maxNumSeqs: must be an integer from 1 to 4096, got '8'"),
        ({"maxNumSeqs": True}, "engine.maxNumSeqs: must be an integer"),
        ({"blockSize": 24}, "engine.blockSize: must be one of (8, 16, 32)"),
        ({"maxModelLen": 8}, "engine.maxModelLen: must be an integer from 16"),
        ({"maxQueueSize": 0}, "engine.maxQueueSize: must be an integer from 1"),
        ({"maxQueueDelayMs": -1}, "engine.maxQueueDelayMs: must be an integer from 0"),
        ({"maxNumSeqs": 256, "maxNumBatchedTokens": 128},
         "engine.maxNumBatchedTokens: must be at least engine.maxNumSeqs (256), got 128"),
        ({"blockSize": 32, "maxNumBatchedTokens": 16},
         "engine.maxNumBatchedTokens: must be at least engine.blockSize (32), got 16"),
        ({"preferredBatchSizes": [4, 64]},
         "engine.preferredBatchSizes: must be an integer from 1 to 32"),
        ({"preferredBatchSizes": [4, 4]}, "engine.preferredBatchSizes: must not repeat a size"),
        ({"preferredBatchSizes": 4}, "engine.preferredBatchSizes: must be a list of integers"),
        ({"queueTimeoutSeconds": 0}, "engine.queueTimeoutSeconds: must be a number of seconds"),
        ({"gpuMemoryUtilization": 0}, "engine.gpuMemoryUtilization: must be a number in (0, 1]"),
        ({"gpuMemoryUtilization": 1.5}, "engine.gpuMemoryUtilization: must be a number in (0, 1]"),
        ({"gpuMemoryUtilization": "90%"}, "engine.gpuMemoryUtilization: must be a number"),
        ({"enablePrefixCaching": "yes"}, "engine.enablePrefixCaching: must be true or false"),
        ({"maxNumSeq": 8}, "engine.maxNumSeq: unknown field"),
    ],
)  # fmt: skip
def test_bad_engine_values_name_the_field(tmp_path, engine, message):
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, serving_doc(**engine))
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": "v2"}, "version: unsupported 'v2'"),
        ({"port": 0}, "port: must be from 1 to 65535, got 0"),
        ({"extra": 1}, "extra: unknown field"),
        ({"engine": [1]}, "engine: expected object, got list"),
        ({"model": {"storageUri": "pkg://x"}}, "model.name: is required"),
        ({"model": {"name": "m", "storageUri": "s3://b/m"}}, "model.storageUri: 's3://b/m' is not"),
        ({"model": {"name": "m", "storageUri": "pkg://m", "format": "onnx"}},
         "model.format: 'onnx' is not one of huggingface, safetensors, gguf"),
        ({"model": {"name": "m", "storageUri": "pkg://m", "task": "chat"}}, "model.task: 'chat'"),
        ({"model": {"name": "m", "storageUri": "pkg://m", "uri": "x"}}, "model.uri: unknown field"),
    ],
)  # fmt: skip
def test_bad_serving_values_name_the_field(tmp_path, change, message):
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, {**serving_doc(), **change})
    assert str(caught.value).startswith(message)


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)


def test_direct_construction_names_the_attribute():
    with pytest.raises(
        ConfigError, match=r"^max_num_batched_tokens: must be at least max_num_seqs"
    ):
        EngineConfig(max_num_seqs=128, max_num_batched_tokens=64)
    with pytest.raises(ConfigError, match=r"^block_size: must be one of"):
        EngineConfig(block_size=12)


def test_a_missing_or_unreadable_file_is_named(tmp_path):
    missing = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError, match=r"absent.yaml: cannot read"):
        read_serving_file(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: [v1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML"):
        read_serving_file(bad)


def test_what_the_operator_renders_is_what_the_engine_reads(tmp_path):
    from inference_operator.render import engine_config as render_engine_config
    from inference_operator.spec import parse_spec
    from infergrid.tracks import STABLE

    spec = parse_spec(
        {"model": {"name": "m", "storageUri": "pkg://llm-tiny"}, "resources": {"gpus": 1},
         "engine": {"maxNumSeqs": 4, "blockSize": 8}},
        "infergrid/engine:0.1.0", "infergrid-scheduler",
    )  # fmt: skip
    served, engine = load(tmp_path, render_engine_config(spec, STABLE))
    assert engine.max_num_seqs == 4 and engine.block_size == 8
    assert served.model.storage_uri == "pkg://llm-tiny"
