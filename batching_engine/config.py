"""The engine's settings, and the serving file the operator writes for every engine pod.

Every value is checked when the config is built, so a typo or an impossible
combination stops the engine at start with the field named (in the file's
spelling when it came from the file), never as a stuck queue at request time.
Integer bounds are the CRD's (`spec.engine`), so what the API server accepts
the engine accepts too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from infergrid.codec import check_version, expect, integer, join, reject_unknown
from infergrid.codec import field as read_field
from infergrid.errors import ContractError
from infergrid.storage_uri import parse_storage_uri
from infergrid.yamlfile import read_yaml

CONFIG_ENV: Final = "INFERGRID_ENGINE_CONFIG"
BLOCK_SIZES: Final = (8, 16, 32)
FORMATS: Final = ("huggingface", "safetensors", "gguf")
TASKS: Final = ("text-generation", "embedding", "classification")

# attribute -> (key in the file's `engine` section, low, high); bounds follow the CRD.
_INTEGERS: Final = {
    "max_num_seqs": ("maxNumSeqs", 1, 4096),
    "max_num_batched_tokens": ("maxNumBatchedTokens", 16, 1048576),
    "max_model_len": ("maxModelLen", 16, 1048576),
    "block_size": ("blockSize", 8, 32),
    "max_queue_size": ("maxQueueSize", 1, 100000),
    "max_batch_size": ("maxBatchSize", 1, 4096),
    "max_queue_delay_ms": ("maxQueueDelayMs", 0, 10000),
    "priority_levels": ("priorityLevels", 1, 16),
}
# Engine-only settings the CRD does not carry; a hand-written file may set them.
_OTHERS: Final = {
    "queue_timeout_s": "queueTimeoutSeconds",
    "enable_prefix_caching": "enablePrefixCaching",
    "preferred_batch_sizes": "preferredBatchSizes",
}
_FILE_KEYS: Final = {attr: key for attr, (key, _, _) in _INTEGERS.items()} | _OTHERS
_IGNORED: Final = ("image",)  # the operator's business: which container runs the engine


class ConfigError(ContractError):
    """A bad engine setting; the message starts with the field's path."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Continuous batching (generation) and dynamic batching (single-pass tasks) limits."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    max_model_len: int = 2048
    block_size: int = 16
    max_queue_size: int = 256
    queue_timeout_s: float = 60.0
    enable_prefix_caching: bool = True
    priority_levels: int = 2
    max_batch_size: int = 32
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ms: int = 5

    def __post_init__(self) -> None:
        _check(asdict(self), str)

    @classmethod
    def from_mapping(cls, doc: object, path: str = "engine") -> EngineConfig:
        """The `engine` section of the serving file; absent keys keep their defaults."""
        with _as_config_error():
            doc = expect(doc, dict, path)
            reject_unknown(doc, [*_FILE_KEYS.values(), *_IGNORED], path)
        values = {attr: doc[key] for attr, key in _FILE_KEYS.items() if key in doc}
        if isinstance(values.get("preferred_batch_sizes"), list):
            values["preferred_batch_sizes"] = tuple(values["preferred_batch_sizes"])
        _check({**asdict(cls()), **values}, lambda attr: join(path, _FILE_KEYS[attr]))
        return cls(**values)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    name: str
    storage_uri: str
    format: str = "huggingface"
    task: str = "text-generation"


@dataclass(frozen=True, slots=True)
class ServingConfig:
    """The whole file at $INFERGRID_ENGINE_CONFIG, as `render.engine_config` writes it."""

    model: ModelConfig
    engine: EngineConfig = field(default_factory=EngineConfig)
    port: int = 8000

    @classmethod
    def from_mapping(cls, doc: object) -> ServingConfig:
        with _as_config_error():
            doc = expect(doc, dict, "config")
            check_version(doc)
            reject_unknown(doc, ["version", "port", "model", "engine"])
            port = integer(doc, "port", low=1, high=65535, default=8000)
            model = _model(read_field(doc, "model", dict))
        engine = EngineConfig.from_mapping(doc.get("engine") or {}, "engine")
        return cls(model=model, engine=engine, port=port)

    @classmethod
    def from_yaml_file(cls, path: str | Path) -> ServingConfig:
        with _as_config_error():
            doc = read_yaml(path)
        return cls.from_mapping(doc)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ServingConfig:
        """The file the operator mounts; its path travels in INFERGRID_ENGINE_CONFIG."""
        path = environ.get(CONFIG_ENV)
        if not path:
            raise ConfigError(CONFIG_ENV, "is not set; it names the engine's config file")
        return cls.from_yaml_file(path)


def _model(doc: dict[str, Any]) -> ModelConfig:
    reject_unknown(doc, ["name", "storageUri", "format", "task"], "model")
    name = read_field(doc, "name", str, "model")
    if len(name) > 253:
        raise ConfigError("model.name", f"must be at most 253 characters, got {len(name)}")
    uri = read_field(doc, "storageUri", str, "model")
    parse_storage_uri(uri, "model.storageUri")
    return ModelConfig(
        name=name,
        storage_uri=uri,
        format=_one_of(doc, "format", FORMATS, "huggingface"),
        task=_one_of(doc, "task", TASKS, "text-generation"),
    )


def _one_of(doc: dict[str, Any], key: str, options: tuple[str, ...], default: str) -> str:
    value = read_field(doc, key, str, "model", default)
    if value not in options:
        raise ConfigError(join("model", key), f"{value!r} is not one of {', '.join(options)}")
    return value


@contextmanager
def _as_config_error() -> Iterator[None]:
    """The shared codec readers raise ContractError; callers of this module catch ConfigError."""
    try:
        yield
    except ConfigError:
        raise
    except ContractError as error:
        raise ConfigError(error.field, error.reason) from None


def _check(values: dict[str, Any], name: Callable[[str], str]) -> None:
    """Every engine value and the rules between them; `name` spells a field for the message."""
    for attr, (_, low, high) in _INTEGERS.items():
        _check_integer(values[attr], name(attr), low, high)
    if values["block_size"] not in BLOCK_SIZES:
        raise ConfigError(name("block_size"), f"must be one of {BLOCK_SIZES}")
    _check_number(values["queue_timeout_s"], name("queue_timeout_s"))
    if not isinstance(values["enable_prefix_caching"], bool):
        raise ConfigError(name("enable_prefix_caching"), "must be true or false")
    _check_preferred(values, name)
    _check_at_least(values, name, "max_num_batched_tokens", "block_size")
    # Every running sequence decodes one token a step, so a step must fit them all.
    _check_at_least(values, name, "max_num_batched_tokens", "max_num_seqs")


def _check_integer(value: object, where: str, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(where, f"must be an integer from {low} to {high}, got {value!r}")


def _check_number(value: object, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86400:
        raise ConfigError(where, f"must be a number of seconds in (0, 86400], got {value!r}")


def _check_preferred(values: dict[str, Any], name: Callable[[str], str]) -> None:
    """Triton's rule: preferred sizes are distinct and none exceeds the largest batch."""
    sizes, where = values["preferred_batch_sizes"], name("preferred_batch_sizes")
    if not isinstance(sizes, tuple):
        raise ConfigError(where, f"must be a list of integers, got {sizes!r}")
    for size in sizes:
        _check_integer(size, where, 1, values["max_batch_size"])
    if len(set(sizes)) != len(sizes):
        raise ConfigError(where, f"must not repeat a size, got {list(sizes)}")


def _check_at_least(
    values: dict[str, Any], name: Callable[[str], str], attr: str, floor: str
) -> None:
    if values[attr] < values[floor]:
        raise ConfigError(
            name(attr), f"must be at least {name(floor)} ({values[floor]}), got {values[attr]}"
        )
