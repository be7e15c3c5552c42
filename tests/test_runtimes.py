"""Serving runtimes: each one's command line from a service's settings, the settings it
refuses, a custom runtime read from the spec, and every runtime's /metrics read into the
one view the autoscaler and the gateway use."""

from __future__ import annotations

import pytest

from infergrid.engine_metrics import parse_engine_metrics
from infergrid.errors import ContractError
from infergrid.runtimes import RUNTIMES, check_settings, custom_runtime
from infergrid.serving_config import read_crd_engine

ENGINE = read_crd_engine({"maxNumSeqs": 8, "maxModelLen": 1024}, "spec.engine")


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_llama_cpp_gets_one_context_for_all_its_slots_and_its_metrics_on():
    args = RUNTIMES["llama.cpp"].args("/mnt/models/m/smollm2.gguf", "smollm2", ENGINE)
    assert flag(args, "--model") == "/mnt/models/m/smollm2.gguf"
    assert flag(args, "--alias") == "smollm2"
    assert (flag(args, "--parallel"), flag(args, "--ctx-size")) == ("8", "8192")
    assert "--metrics" in args and flag(args, "--port") == "8080"


@pytest.mark.parametrize(
    ("runtime", "flags"),
    [
        ("vllm", {"--max-num-seqs": "8", "--max-model-len": "1024", "--block-size": "16",
                  "--gpu-memory-utilization": "0.9", "--served-model-name": "m"}),
        ("sglang", {"--max-running-requests": "8", "--context-length": "1024",
                    "--mem-fraction-static": "0.9", "--served-model-name": "m"}),
    ],
)  # fmt: skip
def test_each_setting_a_runtime_honours_reaches_its_flag(runtime, flags):
    args = RUNTIMES[runtime].args("/models/m", "m", ENGINE)
    assert {name: flag(args, name) for name in flags} == flags
    assert flag(args, "--port") == str(RUNTIMES[runtime].port)


STEP_FLAGS = {"llama.cpp": "--batch-size", "vllm": "--max-num-batched-tokens",
              "sglang": "--chunked-prefill-size"}  # fmt: skip


@pytest.mark.parametrize("runtime", sorted(STEP_FLAGS))
def test_a_step_budget_reaches_the_runtime_and_0_leaves_it_to_the_runtime(runtime):
    """maxNumBatchedTokens 0 (the CRD's default) is the bundled engine's device default;
    another runtime then keeps its own default rather than get ours."""
    asked = read_crd_engine({"maxNumSeqs": 8, "maxNumBatchedTokens": 1024}, "spec.engine")
    assert flag(RUNTIMES[runtime].args("/models/m", "m", asked), STEP_FLAGS[runtime]) == "1024"
    assert STEP_FLAGS[runtime] not in RUNTIMES[runtime].args("/models/m", "m", ENGINE)


@pytest.mark.parametrize(
    ("runtime", "key"),
    [("llama.cpp", "quantization"), ("llama.cpp", "blockSize"), ("sglang", "blockSize"),
     ("vllm", "maxQueueDelayMs")],
)  # fmt: skip
def test_a_setting_the_runtime_cannot_honour_is_refused_naming_the_field(runtime, key):
    asked = {**ENGINE, key: {"quantization": "int8"}.get(key, 8)}
    with pytest.raises(ContractError) as caught:
        check_settings(RUNTIMES[runtime], asked)
    assert caught.value.field == f"spec.engine.{key}"
    assert f"the {runtime} runtime" in str(caught.value)


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_defaults_the_api_server_filled_in_are_no_request(runtime):
    """Every CRD default is in a stored spec.engine, asked for or not."""
    check_settings(RUNTIMES[runtime], {**ENGINE, "image": "registry.example/x:1"})


EXPOSITIONS = {
    "infergrid": """
# TYPE infergrid_engine_queue_depth gauge
infergrid_engine_queue_depth 3
# TYPE infergrid_engine_running_sequences gauge
infergrid_engine_running_sequences 5
# TYPE infergrid_engine_kv_cache_usage_ratio gauge
infergrid_engine_kv_cache_usage_ratio 0.25
""",
    "vllm": """
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 3.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 5.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
""",
    "sglang": """
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 3.0
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 5.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.25
""",
    # As the pinned llama-server writes it (its gauges; no KV-cache one).
    "llama.cpp": """
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 0
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 0
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 5
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
""",
}
KV_USAGE = {"llama.cpp": None}  # the others: 0.25


@pytest.mark.parametrize("runtime", sorted(RUNTIMES))
def test_every_runtimes_metrics_read_into_the_same_view(runtime):
    assert set(EXPOSITIONS) == set(RUNTIMES)
    sample = parse_engine_metrics(EXPOSITIONS[runtime], RUNTIMES[runtime].metrics)
    kv_usage = KV_USAGE.get(runtime, 0.25)
    assert (sample.queue_depth, sample.running, sample.kv_usage) == (3, 5, kv_usage)
    assert sample.requests_held == 8


def test_one_runtimes_series_mean_nothing_to_another():
    sample = parse_engine_metrics(EXPOSITIONS["vllm"], RUNTIMES["sglang"].metrics)
    assert (sample.queue_depth, sample.running, sample.kv_usage) == (None, None, None)


CUSTOM = {
    "port": 9000,
    "readyPath": "/ready",
    "livePath": "/live",
    "metrics": {"queueDepth": "tgi_queue_size", "running": "tgi_batch_current_size"},
}


def test_a_custom_runtime_is_what_the_spec_says():
    runtime = custom_runtime(CUSTOM)
    assert (runtime.port, runtime.ready_path, runtime.live_path) == (9000, "/ready", "/live")
    assert runtime.args("/m", "m", ENGINE) == []
    assert custom_runtime({**CUSTOM, "args": ["--x", "1"]}).args("/m", "m", ENGINE) == ["--x", "1"]
    text = "# TYPE tgi_queue_size gauge\ntgi_queue_size 2\n"
    assert parse_engine_metrics(text, runtime.metrics).queue_depth == 2
    check_settings(runtime, read_crd_engine({}, "spec.engine"))  # the defaults only
    with pytest.raises(ContractError) as caught:
        check_settings(runtime, ENGINE)  # maxNumSeqs 8 and maxModelLen 1024 were asked for
    assert caught.value.field == "spec.engine.maxNumSeqs"


METRICS = "spec.customRuntime.metrics"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"port": 0}, "spec.customRuntime.port"),
        ({"readyPath": "health"}, "spec.customRuntime.readyPath"),
        ({"livePath": "/a b"}, "spec.customRuntime.livePath"),
        ({"metrics": {"running": "r"}}, f"{METRICS}.queueDepth"),
        ({"metrics": {"queueDepth": "q", "running": "9lives"}}, f"{METRICS}.running"),
        ({"metrics": {"queueDepth": "q", "running": "r", "ttft": "t"}}, METRICS),
        ({"command": ["sh"]}, "spec.customRuntime"),
        ({"args": ["--port", 9000]}, "spec.customRuntime.args[1]"),
    ],
)  # fmt: skip
def test_a_bad_custom_runtime_is_refused_naming_the_field(change, field):
    with pytest.raises(ContractError) as caught:
        custom_runtime({**CUSTOM, **change})
    assert caught.value.field.startswith(field)
