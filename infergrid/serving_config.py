"""The serving file: what the operator writes for every engine pod and the engine reads.

The one table of the engine's settings lives here: each setting's key in the file (and in
the CRD's `spec.engine`, where it is one), its attribute, bounds, default, flag and help.
The operator reads `spec.engine` and renders the file with it, the engine parses the file
and builds its flags from it, and tests/test_crd_schema.py holds the CRD equal to it, so
what the API server accepts, the operator renders and the engine reads cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from infergrid.codec import check_version, expect, field, integer, join, one_of, reject_unknown
from infergrid.constants import SCHEMA_VERSION
from infergrid.errors import ContractError
from infergrid.settings import Setting
from infergrid.storage_uri import parse_storage_uri

CONFIG_ENV: Final = "INFERGRID_ENGINE_CONFIG"
DEFAULT_PORT: Final = 8000
FORMATS: Final = ("huggingface", "safetensors", "gguf")
TASKS: Final = ("text-generation", "embedding", "classification")
MODEL_NAME_MAX_LENGTH: Final = 253
# spec.engine keys that are the operator's business and never reach the engine's file.
OPERATOR_ONLY: Final = ("image",)
MAX_QUEUE_TIMEOUT_S: Final = 86400
# How the engine holds its linear weights; `auto` keeps a GGUF's quantized tensors quantized
# where the device has fast kernels for them (batching_engine/model/quantization.py).
QUANTIZATIONS: Final = ("auto", "none", "int8", "int4")


@dataclass(frozen=True, slots=True)
class EngineSetting:
    """One engine setting. `kind` is the value's type (`tuple` for a list of integers, `str`
    for one of `choices`);
    `in_crd` is False for settings deliberately left to hand-written files and flags."""

    key: str
    attr: str
    kind: type
    default: Any
    flag: str
    help: str
    in_crd: bool
    low: int = 0  # bounds of an integer, and `high` of a number in (0, high]
    high: int = 0
    choices: tuple[Any, ...] = ()
    unit: str = ""  # what a number counts, for the message: "seconds"

    def check(self, value: object, where: str) -> Any:
        """`value` checked against this setting alone; the error names `where`."""
        return _READERS[self.kind](self, value, where)

    def read(self, doc: Mapping[str, Any], key: str) -> Any:
        """`doc[key]` checked, as `infergrid.settings` hands over a flag's value: a list
        arrives as "4,8", or as 8 once the flag's digits were read as a number."""
        value = doc[key]
        if self.kind is tuple and isinstance(value, str | int):
            value = _comma_list(str(value), key)
        return self.check(value, key)

    def setting(self) -> Setting:
        """This setting for `infergrid.settings`, which adds its flag and reads flag values."""
        return Setting(
            self.key, self.attr, self.read, self.help, boolean=self.kind is bool, cli=self.flag
        )


def _integer(spec: EngineSetting, value: object, where: str) -> int:
    check_integer(value, where, spec.low, spec.high)
    if spec.choices and value not in spec.choices:
        raise ContractError(where, f"must be one of {spec.choices}")
    return value  # type: ignore[return-value]


def _choice(spec: EngineSetting, value: object, where: str) -> str:
    if value not in spec.choices or not isinstance(value, str):
        raise ContractError(where, f"must be one of {', '.join(spec.choices)}, got {value!r}")
    return value


def _number(spec: EngineSetting, value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= spec.high:
        what = f"a number of {spec.unit}" if spec.unit else "a number"
        raise ContractError(where, f"must be {what} in (0, {spec.high}], got {value!r}")
    return float(value)


def _boolean(spec: EngineSetting, value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ContractError(where, "must be true or false")
    return value


def _sizes(spec: EngineSetting, value: object, where: str) -> tuple[int, ...]:
    """A list; each size's bound depends on another setting, so the engine checks them."""
    if not isinstance(value, list | tuple):
        raise ContractError(where, f"must be a list of integers, got {value!r}")
    return tuple(value)


def _comma_list(text: str, where: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ContractError(where, f"must be a list of integers, got {text!r}") from None


_READERS: Final[dict[type, Callable[[EngineSetting, object, str], Any]]] = {
    int: _integer,
    float: _number,
    bool: _boolean,
    tuple: _sizes,
    str: _choice,
}


def check_integer(value: object, where: str, low: int, high: int) -> None:
    """The one integer rule of the file and the flags: booleans are no integers."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ContractError(where, f"must be an integer from {low} to {high}, got {value!r}")


# In the CRD's order, which is also the order the operator writes them in.
ENGINE_SETTINGS: Final = (
    EngineSetting("maxNumSeqs", "max_num_seqs", int, 64, "--max-num-seqs",
                  "sequences generated together", True, 1, 4096),
    EngineSetting("maxNumBatchedTokens", "max_num_batched_tokens", int, 0,
                  "--max-num-batched-tokens",
                  "tokens per step (0: the device's default, 4096 on a GPU and 512 on the CPU)",
                  True, 0, 1048576),
    EngineSetting("maxModelLen", "max_model_len", int, 2048, "--max-model-len",
                  "longest prompt + output, in tokens", True, 16, 1048576),
    EngineSetting("blockSize", "block_size", int, 16, "--block-size",
                  "tokens per KV-cache block (8, 16 or 32)", True, 8, 32, (8, 16, 32)),
    EngineSetting("maxBatchSize", "max_batch_size", int, 32, "--max-batch-size",
                  "inputs per single-pass batch", True, 1, 4096),
    EngineSetting("maxQueueDelayMs", "max_queue_delay_ms", int, 5, "--max-queue-delay-ms",
                  "longest wait to fill a batch", True, 0, 10000),
    EngineSetting("maxQueueSize", "max_queue_size", int, 256, "--max-queue-size",
                  "waiting requests before 429s", True, 1, 100000),
    EngineSetting("quantization", "quantization", str, "auto", "--quantization",
                  "linear weights: auto (a GGUF's own, where fast), none, int8 or int4", True,
                  choices=QUANTIZATIONS),
    EngineSetting("gpuMemoryUtilization", "gpu_memory_utilization", float, 0.9,
                  "--gpu-memory-utilization",
                  "fraction of the GPU memory budget (the share, or the card) the engine uses; "
                  "GPUs only", True, high=1),
    EngineSetting("tensorParallelSize", "tensor_parallel_size", int, 0,
                  "--tensor-parallel-size",
                  "ranks splitting each layer (0: one per visible GPU, 1 on the CPU); the "
                  "operator sets the replica's GPU count", False, 0, 64),
    EngineSetting("queueTimeoutSeconds", "queue_timeout_s", float, 60.0, "--queue-timeout",
                  "seconds a request may wait to start", False, high=MAX_QUEUE_TIMEOUT_S,
                  unit="seconds"),
    EngineSetting("enablePrefixCaching", "enable_prefix_caching", bool, True,
                  "--prefix-caching", "reuse KV-cache blocks of shared prompt prefixes", False),
    EngineSetting("priorityLevels", "priority_levels", int, 2, "--priority-levels",
                  "request priority classes (0 first)", False, 1, 16),
    EngineSetting("preferredBatchSizes", "preferred_batch_sizes", tuple, (),
                  "--preferred-batch-sizes", "single-pass sizes sent at once, e.g. 4,8", False),
)  # fmt: skip
CRD_SETTINGS: Final = tuple(s for s in ENGINE_SETTINGS if s.in_crd)
BY_ATTR: Final = {s.attr: s for s in ENGINE_SETTINGS}


@dataclass(frozen=True, slots=True)
class ModelRef:
    """The file's `model` section: which weights to serve, under which name, for what."""

    name: str
    storage_uri: str
    format: str = FORMATS[0]
    task: str = TASKS[0]


@dataclass(frozen=True, slots=True)
class ServingFile:
    """The file, decoded: `engine` holds only the settings it sets, by attribute."""

    model: ModelRef
    engine: Mapping[str, Any]
    port: int = DEFAULT_PORT


def read_crd_engine(doc: Mapping[str, Any], path: str) -> dict[str, Any]:
    """An InferenceService's `spec.engine` settings by key, each defaulted as the CRD does
    (an object stored before the CRD had defaults may lack them)."""
    return {
        s.key: s.default if doc.get(s.key) is None else s.check(doc[s.key], join(path, s.key))
        for s in CRD_SETTINGS
    }


def encode(model: ModelRef, engine: Mapping[str, Any], port: int = DEFAULT_PORT) -> dict[str, Any]:
    """The file for one engine; `engine` by key, as `read_crd_engine` gives it."""
    return {
        "version": SCHEMA_VERSION,
        "port": port,
        "model": {
            "name": model.name,
            "storageUri": model.storage_uri,
            "format": model.format,
            "task": model.task,
        },
        "engine": dict(engine),
    }


def decode(doc: object) -> ServingFile:
    """The file as written by `encode` or by hand; a bad value is named in its spelling."""
    doc = expect(doc, dict, "config")
    check_version(doc)
    reject_unknown(doc, ["version", "port", "model", "engine"])
    port = integer(doc, "port", low=1, high=65535, default=DEFAULT_PORT)
    model = _model(field(doc, "model", dict))
    return ServingFile(model=model, engine=_engine(doc.get("engine") or {}), port=port)


def _engine(doc: object) -> dict[str, Any]:
    """The settings the `engine` section sets, by attribute; `image` is the operator's."""
    doc = expect(doc, dict, "engine")
    reject_unknown(doc, [*(s.key for s in ENGINE_SETTINGS), *OPERATOR_ONLY], "engine")
    return {
        s.attr: s.check(doc[s.key], join("engine", s.key)) for s in ENGINE_SETTINGS if s.key in doc
    }


def _model(doc: dict[str, Any]) -> ModelRef:
    reject_unknown(doc, ["name", "storageUri", "format", "task"], "model")
    name = field(doc, "name", str, "model")
    if len(name) > MODEL_NAME_MAX_LENGTH:
        raise ContractError(
            "model.name", f"must be at most {MODEL_NAME_MAX_LENGTH} characters, got {len(name)}"
        )
    uri = field(doc, "storageUri", str, "model")
    parse_storage_uri(uri, "model.storageUri")
    return ModelRef(
        name=name,
        storage_uri=uri,
        format=one_of(doc, "format", FORMATS, "model", FORMATS[0]),
        task=one_of(doc, "task", TASKS, "model", TASKS[0]),
    )
