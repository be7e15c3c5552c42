"""The engine's settings: one typed config, from the serving file and the flags.

`Settings` is everything one engine process runs with; its `engine` section, the batching
limits, is an `EngineConfig` because the scheduler and the server take only that. Both are
read through `infergrid.settings` from the tables here and in `infergrid.serving_config`,
so the file, the flags and the CRD share one set of keys, bounds and defaults.

Every value is checked when the config is built, so a typo or an impossible combination
stops the engine at start with the field named (in the file's spelling when it came from
the file, the flag's when it came from a flag), never as a stuck queue at request time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

from batching_engine.device import AUTO, check_device
from infergrid.codec import join
from infergrid.errors import ContractError
from infergrid.serving_config import (
    BY_ATTR,
    DEFAULT_PORT,
    ENGINE_SETTINGS,
    TASKS,
    ServingFile,
    check_integer,
    decode,
)
from infergrid.settings import Setting, boolean, choice, number, text, whole
from infergrid.storage_uri import ALLOW_DOWNLOAD_ENV
from infergrid.yamlfile import read_yaml

DTYPES: Final = ("float32", "bfloat16", "float16")
# A step's token budget where `max_num_batched_tokens` is 0, by device. On the CPU a step's
# time grows with its tokens, and no sequence of a step gets its first token before the step
# ends: with 64 in flight, SmolLM2 on 2 cores (bench/engine_vs_llamacpp.py), 512 tokens a step
# started requests in 755 ms (TTFT p50) against 4096's 2535, at the same tokens/s.
STEP_TOKENS: Final = {"cuda": 4096, "cpu": 512}
DEFAULT_MAX_BODY_BYTES: Final = 4 << 20
DEFAULT_READ_TIMEOUT_S: Final = 30.0


class ConfigError(ContractError):
    """A bad engine setting; the message starts with the field's path."""


@contextmanager
def _as_config_error() -> Iterator[None]:
    """The shared readers raise ContractError; callers of this module catch ConfigError."""
    try:
        yield
    except ConfigError:
        raise
    except ContractError as err:
        raise ConfigError(err.field, err.reason) from None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Continuous batching (generation) and dynamic batching (single-pass tasks) limits;
    the defaults are `infergrid.serving_config`'s, which are the CRD's."""

    max_num_seqs: int = BY_ATTR["max_num_seqs"].default
    max_num_batched_tokens: int = BY_ATTR["max_num_batched_tokens"].default
    max_model_len: int = BY_ATTR["max_model_len"].default
    block_size: int = BY_ATTR["block_size"].default
    max_queue_size: int = BY_ATTR["max_queue_size"].default
    queue_timeout_s: float = BY_ATTR["queue_timeout_s"].default
    enable_prefix_caching: bool = BY_ATTR["enable_prefix_caching"].default
    priority_levels: int = BY_ATTR["priority_levels"].default
    max_batch_size: int = BY_ATTR["max_batch_size"].default
    preferred_batch_sizes: tuple[int, ...] = BY_ATTR["preferred_batch_sizes"].default
    max_queue_delay_ms: int = BY_ATTR["max_queue_delay_ms"].default
    quantization: str = BY_ATTR["quantization"].default
    tensor_parallel_size: int = BY_ATTR["tensor_parallel_size"].default
    gpu_memory_utilization: float = BY_ATTR["gpu_memory_utilization"].default

    def __post_init__(self) -> None:
        values = asdict(self)
        with _as_config_error():
            for setting in ENGINE_SETTINGS:
                setting.check(values[setting.attr], setting.attr)
        check_rules(values, str)

    def for_device(self, device_type: str) -> EngineConfig:
        """This config with `max_num_batched_tokens` 0 made the device's step budget
        (`STEP_TOKENS`), raised to fit every running sequence's decode and a whole block."""
        if self.max_num_batched_tokens:
            return self
        tokens = STEP_TOKENS["cuda" if device_type == "cuda" else "cpu"]
        return replace(self, max_num_batched_tokens=max(tokens, self.max_num_seqs, self.block_size))

    @classmethod
    def build(cls, values: Mapping[str, Any], name: Callable[[str], str]) -> EngineConfig:
        """The defaults with `values` (by attribute, each already checked alone) over them;
        a rule between settings is reported with `name`, the spelling the user wrote."""
        merged = {**asdict(cls()), **values}
        check_rules(merged, name)
        return cls(**merged)


def check_rules(values: Mapping[str, Any], name: Callable[[str], str]) -> None:
    """The rules between settings; `name` spells a field for the message."""
    _check_preferred(values, name)
    if values["max_num_batched_tokens"]:  # 0: the device's, made to fit (`for_device`)
        _check_at_least(values, name, "max_num_batched_tokens", "block_size")
        # Every running sequence decodes one token a step, so a step must fit them all.
        _check_at_least(values, name, "max_num_batched_tokens", "max_num_seqs")


def _check_preferred(values: Mapping[str, Any], name: Callable[[str], str]) -> None:
    """Triton's rule: preferred sizes are distinct and none exceeds the largest batch."""
    sizes, where = values["preferred_batch_sizes"], name("preferred_batch_sizes")
    with _as_config_error():
        for size in sizes:
            check_integer(size, where, 1, values["max_batch_size"])
    if len(set(sizes)) != len(sizes):
        raise ConfigError(where, f"must not repeat a size, got {list(sizes)}")


def _check_at_least(
    values: Mapping[str, Any], name: Callable[[str], str], attr: str, floor: str
) -> None:
    if values[attr] < values[floor]:
        raise ConfigError(
            name(attr), f"must be at least {name(floor)} ({values[floor]}), got {values[attr]}"
        )


def file_name(attr: str) -> str:
    """An engine setting in the serving file's spelling: `engine.maxNumSeqs`."""
    return join("engine", BY_ATTR[attr].key)


@dataclass(frozen=True, slots=True)
class Settings:
    """One engine process: the model it serves, its batching limits and its process knobs."""

    model_uri: str
    model_name: str
    task: str = TASKS[0]
    engine: EngineConfig = field(default_factory=EngineConfig)
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    device: str = AUTO
    dtype: str | None = None
    kv_cache_memory: str | None = None
    kv_cache_dtype: str = "auto"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    cpu_threads: int | None = None  # None: every usable CPU
    allow_download: bool = False
    caller_token: str = field(default="", repr=False)  # server/caller_token.py; "": none


def device(doc: dict[str, Any], key: str) -> str:
    """auto, cpu, cuda or cuda:N; a flag's digits arrive as a number, hence str()."""
    value = str(doc[key])
    check_device(value)
    return value


# The process's own settings, flags only: the operator's file carries the model and batching.
PROCESS_SETTINGS: Final = (
    Setting("storageUri", "model_uri", text,
            "pkg://NAME, file://PATH, pvc://CLAIM/PATH, hf://ORG/NAME[@REV] or a path",
            cli="--model"),
    Setting("name", "model_name", text, "the name clients send as `model`"),
    Setting("task", "task", choice(TASKS), f"one of {', '.join(TASKS)}"),
    Setting("host", "host", text, "address to listen on"),
    Setting("port", "port", whole(1, 65535), "port to listen on"),
    Setting("device", "device", device,
            "auto (default: the GPU when one is visible), cpu, cuda, cuda:N"),
    Setting("dtype", "dtype", choice(DTYPES), f"one of {', '.join(DTYPES)}"),
    Setting("kvCacheMemory", "kv_cache_memory", text,
            "KV-cache size on CPU (or a cap on GPU), e.g. 1GiB"),
    Setting("kvCacheDtype", "kv_cache_dtype", choice(("auto", *DTYPES)),
            "auto (float16 for a float32 model on the CPU, else the model's dtype) or one of "
            f"{', '.join(DTYPES)}"),
    Setting("maxBodyBytes", "max_body_bytes", whole(1), "largest request body"),
    Setting("readTimeoutS", "read_timeout_s", number(0.01, 3600),
            "seconds a client may take to send a request, headers and body (a 408 after "
            "that), and an idle connection stays open"),
    Setting("cpuThreads", "cpu_threads", whole(1), "torch CPU threads (default: every usable CPU)"),
    Setting("allowDownload", "allow_download", boolean,
            f"fetch hf:// models missing from the cache (also ${ALLOW_DOWNLOAD_ENV}=true)",
            boolean=True),
)  # fmt: skip
ENGINE_FLAGS: Final = tuple(s.setting() for s in ENGINE_SETTINGS)


def read_serving_file(path: str | Path) -> ServingFile:
    """The operator's file; any problem, reading it included, is a ConfigError naming it."""
    with _as_config_error():
        return decode(read_yaml(path))


def file_settings(served: ServingFile) -> dict[str, Any]:
    """The process settings the file sets: the model, its name and task, and the port."""
    model = served.model
    return {"model_uri": model.storage_uri, "model_name": model.name, "task": model.task,
            "port": served.port}  # fmt: skip


def engine_config(file_values: Mapping[str, Any], flags: Mapping[str, Any]) -> EngineConfig:
    """The file's batching limits, checked alone as the file's, then the flags over them;
    a broken rule names what the user wrote: the flag, else the file's key."""
    EngineConfig.build(file_values, file_name)

    def name(attr: str) -> str:
        if attr in flags:
            return BY_ATTR[attr].flag
        return file_name(attr) if attr in file_values else attr

    return EngineConfig.build({**file_values, **flags}, name)
