"""Serving runtimes: what runs inside an InferenceService's pods, and how InferGrid reads it.

Placement, sharing, the gateway and the autoscaler work the same whatever serves in the
pod. A runtime says what differs: the port its OpenAI-style API listens on, the paths that
answer its readiness and liveness probes, the command line it takes for a model and the
service's engine settings (`spec.engine`), which of those settings it honours, and which of
its Prometheus series mean the queue, the running requests, latency and KV-cache use that
the autoscaler and the gateway read (`infergrid.engine_metrics.MetricNames`).

`infergrid` is the bundled engine, which reads its settings from the serving file rather than
from flags. The others take their flags from `args`. A setting a runtime has no flag for is
refused by `check_settings`, naming the field, rather than silently dropped.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from infergrid.codec import expect, field, integer, join, one_of, reject_unknown
from infergrid.engine_metrics import INFERGRID_METRICS, MetricNames
from infergrid.errors import ContractError
from infergrid.serving_config import CRD_SETTINGS, DEFAULT_PORT

# The arguments of one runtime, from the model's local path, its served name and the
# service's engine settings by CRD key (defaults filled in, as `read_crd_engine` gives them).
Args = Callable[[str, str, Mapping[str, Any]], list[str]]


@dataclass(frozen=True, slots=True)
class Runtime:
    """One serving runtime, as the operator renders it and the readers read it."""

    name: str
    port: int
    ready_path: str
    live_path: str
    metrics: MetricNames
    settings: frozenset[str]  # the spec.engine keys it honours
    args: Args | None  # None: it reads the serving file (the bundled engine)
    model_file: bool = False  # it loads one file (a GGUF), not a model directory
    # The program, where the runtime's images do not start it themselves; () their entrypoint.
    command: tuple[str, ...] = ()


def _step_tokens(flag: str, engine: Mapping[str, Any]) -> list[str]:
    """The runtime's flag for a step's tokens; none for 0, which leaves it to the runtime."""
    tokens = engine["maxNumBatchedTokens"]
    return [flag, str(tokens)] if tokens else []


def _llama_cpp_args(path: str, name: str, engine: Mapping[str, Any]) -> list[str]:
    """llama-server: one context holds every parallel slot, so its size is slots x length."""
    slots, length = engine["maxNumSeqs"], engine["maxModelLen"]
    return [
        "--model", path, "--alias", name, "--host", "0.0.0.0", "--port", str(LLAMA_CPP_PORT),
        "--metrics", "--parallel", str(slots), "--ctx-size", str(slots * length),
        *_step_tokens("--batch-size", engine),
    ]  # fmt: skip


def _vllm_args(path: str, name: str, engine: Mapping[str, Any]) -> list[str]:
    return [
        "--model", path, "--served-model-name", name, "--host", "0.0.0.0",
        "--port", str(VLLM_PORT),
        "--max-num-seqs", str(engine["maxNumSeqs"]),
        "--max-model-len", str(engine["maxModelLen"]),
        *_step_tokens("--max-num-batched-tokens", engine),
        "--block-size", str(engine["blockSize"]),
        "--gpu-memory-utilization", str(engine["gpuMemoryUtilization"]),
    ]  # fmt: skip


def _sglang_args(path: str, name: str, engine: Mapping[str, Any]) -> list[str]:
    return [
        "--model-path", path, "--served-model-name", name, "--host", "0.0.0.0",
        "--port", str(SGLANG_PORT), "--enable-metrics",
        "--max-running-requests", str(engine["maxNumSeqs"]),
        "--context-length", str(engine["maxModelLen"]),
        *_step_tokens("--chunked-prefill-size", engine),
        "--mem-fraction-static", str(engine["gpuMemoryUtilization"]),
    ]  # fmt: skip


METRIC_NAME: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LLAMA_CPP_PORT: Final = 8080
VLLM_PORT: Final = 8000
SGLANG_PORT: Final = 30000
# The batch settings every runtime has a flag for.
_BATCH_KEYS: Final = frozenset({"maxNumSeqs", "maxModelLen", "maxNumBatchedTokens"})

RUNTIMES: Final = {
    "infergrid": Runtime(
        "infergrid", DEFAULT_PORT, "/readyz", "/healthz", INFERGRID_METRICS,
        frozenset(s.key for s in CRD_SETTINGS), args=None,
    ),
    "llama.cpp": Runtime(
        "llama.cpp", LLAMA_CPP_PORT, "/health", "/health",
        # The pinned llama-server (images/llama_server.py) exports no KV-cache gauge and no
        # latency histogram: only counters and these two gauges.
        MetricNames(
            queue_depth="llamacpp:requests_deferred",
            running="llamacpp:requests_processing",
        ),
        _BATCH_KEYS, _llama_cpp_args, model_file=True,
    ),
    "vllm": Runtime(
        "vllm", VLLM_PORT, "/health", "/health",
        MetricNames(
            queue_depth="vllm:num_requests_waiting",
            running="vllm:num_requests_running",
            latency="vllm:e2e_request_latency_seconds",
            kv_usage="vllm:kv_cache_usage_perc",  # a fraction, despite its name
        ),
        _BATCH_KEYS | {"blockSize", "gpuMemoryUtilization"}, _vllm_args,
        command=("python3", "-m", "vllm.entrypoints.openai.api_server"),
    ),
    "sglang": Runtime(
        "sglang", SGLANG_PORT, "/health", "/health",
        MetricNames(
            queue_depth="sglang:num_queue_reqs",
            running="sglang:num_running_reqs",
            latency="sglang:e2e_request_latency_seconds",
            kv_usage="sglang:token_usage",
        ),
        _BATCH_KEYS | {"gpuMemoryUtilization"}, _sglang_args,
        command=("python3", "-m", "sglang.launch_server"),
    ),
}  # fmt: skip
# spec.runtime's choices: the table's, and one the service describes (spec.customRuntime).
RUNTIME_NAMES: Final = (*RUNTIMES, "custom")


def read_runtime(spec: Mapping[str, Any], path: str = "spec") -> Runtime:
    """An InferenceService's runtime: `runtime` (the bundled engine when unset), and
    `customRuntime` exactly when it is custom."""
    name = one_of(spec, "runtime", RUNTIME_NAMES, path, "infergrid")
    custom = spec.get("customRuntime")
    if (name == "custom") != (custom is not None):
        raise ContractError(
            join(path, "customRuntime"), f"is set exactly when {path}.runtime is custom"
        )
    if custom is None:
        return RUNTIMES[name]
    return custom_runtime(expect(custom, dict, join(path, "customRuntime")))


def check_settings(runtime: Runtime, engine: Mapping[str, Any], path: str = "spec.engine") -> None:
    """Refuse a setting `runtime` has no way to honour that asks for other than its default.
    The API server fills every CRD default into `spec.engine`, so a default value is no
    request; `image` is the operator's, and goes with any runtime."""
    defaults = {s.key: s.default for s in CRD_SETTINGS}
    for key, value in engine.items():
        if key == "image" or key in runtime.settings or value == defaults.get(key, value):
            continue
        raise ContractError(
            f"{path}.{key}",
            f"is not a setting the {runtime.name} runtime takes (it takes "
            f"{', '.join(sorted(runtime.settings)) or 'none'}); leave it at its default",
        )


def custom_runtime(doc: Mapping[str, Any], path: str = "spec.customRuntime") -> Runtime:
    """A runtime the service describes itself: its entrypoint's arguments, port, probe paths
    and the series of its metrics (`queueDepth` and `running` required). Its arguments are
    its own, so no engine setting applies to it."""
    reject_unknown(doc, ["args", "port", "readyPath", "livePath", "metrics"], path)
    given = field(doc, "args", list, path, [])
    args = tuple(expect(a, str, join(join(path, "args"), i)) for i, a in enumerate(given))
    port = integer(doc, "port", path, low=1, high=65535)
    metrics = field(doc, "metrics", dict, path)
    metrics_path = join(path, "metrics")
    reject_unknown(metrics, ["queueDepth", "running", "latency", "kvUsage"], metrics_path)
    names = MetricNames(
        queue_depth=_series(metrics, "queueDepth", metrics_path),
        running=_series(metrics, "running", metrics_path),
        latency=_series(metrics, "latency", metrics_path, required=False),
        kv_usage=_series(metrics, "kvUsage", metrics_path, required=False),
    )
    return Runtime(
        "custom", port, _probe_path(doc, "readyPath", path), _probe_path(doc, "livePath", path),
        names, frozenset(), args=lambda _path, _name, _engine: list(args),
    )  # fmt: skip


def _series(doc: Mapping[str, Any], key: str, path: str, *, required: bool = True) -> str | None:
    """A Prometheus metric name, as the exposition format allows it."""
    name = field(doc, key, str, path) if required else field(doc, key, str, path, None)
    if name is not None and not METRIC_NAME.fullmatch(name):
        raise ContractError(join(path, key), f"{name!r} is not a Prometheus metric name")
    return name


def _probe_path(doc: Mapping[str, Any], key: str, path: str) -> str:
    value = field(doc, key, str, path)
    if not value.startswith("/") or len(value) > 256 or any(c.isspace() for c in value):
        raise ContractError(join(path, key), f"must be a URL path such as /health, got {value!r}")
    return value
