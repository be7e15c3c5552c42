"""How an embedding model turns token states into one vector, from its own files.

A sentence-transformers model says it in `modules.json`: the transformer, then a Pooling module
(whose `config.json` picks mean, [CLS] or last-token pooling), then optionally Normalize. A model
without modules.json gets mean pooling, L2-normalised. Anything else (max pooling, Dense
projections, several modes at once) is refused at load time, naming the file and field, since
the vectors would otherwise be silently different from the model's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infergrid.errors import ContractError

_MODULE_PREFIX = "sentence_transformers.models."
# The module sequences understood, by class name.
_PIPELINES = (("Transformer", "Pooling"), ("Transformer", "Pooling", "Normalize"))
# 1_Pooling/config.json flag -> our pooling mode (heads.POOLING_MODES).
_POOLING_FLAGS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}
_UNSUPPORTED_FLAGS = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
)


@dataclass(frozen=True, slots=True)
class Pooling:
    mode: str  # one of heads.POOLING_MODES
    normalize: bool


DEFAULT_POOLING = Pooling("mean", normalize=True)


def read_pooling(model_dir: str | Path) -> Pooling:
    """The model's sentence-transformers pooling, or DEFAULT_POOLING when it ships none."""
    model_dir = Path(model_dir)
    modules = _read_json(model_dir / "modules.json", "modules.json")
    if modules is None:
        return DEFAULT_POOLING
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise ContractError("modules.json", "must be a list of module objects")
    kinds = tuple(str(m.get("type", "")).removeprefix(_MODULE_PREFIX) for m in modules)
    if kinds not in _PIPELINES:
        raise ContractError(
            "modules.json",
            f"modules {', '.join(kinds)} are not supported; "
            "known: Transformer, Pooling and an optional Normalize",
        )
    pooling_dir = str(modules[1].get("path", ""))
    config_name = f"{pooling_dir}/config.json" if pooling_dir else "config.json"
    config = _read_json(model_dir / config_name, config_name)
    if config is None:
        raise ContractError(config_name, "missing: modules.json names a Pooling module there")
    if not isinstance(config, dict):
        raise ContractError(config_name, "the Pooling module's config must be a JSON object")
    return Pooling(_pooling_mode(config, config_name), normalize=kinds[-1] == "Normalize")


def _pooling_mode(config: dict[str, Any], name: str) -> str:
    unsupported = [flag for flag in _UNSUPPORTED_FLAGS if config.get(flag)]
    if unsupported:
        raise ContractError(f"{name}:{unsupported[0]}", "this pooling mode is not supported")
    modes = [mode for flag, mode in _POOLING_FLAGS.items() if config.get(flag)]
    if len(modes) != 1:
        flags = ", ".join(_POOLING_FLAGS)
        raise ContractError(name, f"exactly one of {flags} must be true, got {len(modes)}")
    return modes[0]


def _read_json(path: Path, name: str) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ContractError(name, f"not valid JSON: {error}") from None
