"""Typed reads of config.json fields shared by every model family: each refusal names the field
(with its section as a prefix: `rope_parameters.factor`)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from infergrid.errors import ContractError


def positive_int(
    raw: dict[str, Any], key: str, *, default: int | None = None, prefix: str = ""
) -> int:
    field = f"{prefix}.{key}" if prefix else key
    value = raw.get(key, default)
    if value is None:
        raise ContractError(field, "missing")
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ContractError(field, f"expected a positive integer, got {value!r}")
    return value


def positive_float(
    raw: dict[str, Any], key: str, *, default: float | None = None, prefix: str = ""
) -> float:
    field = f"{prefix}.{key}" if prefix else key
    value = raw.get(key, default)
    if value is None:
        raise ContractError(field, "missing")
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ContractError(field, f"expected a positive number, got {value!r}")
    return float(value)


def token_ids(value: Any, field: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ContractError(field, f"expected a token id or a list of them, got {value!r}")
    return tuple(values)


def num_labels(raw: dict[str, Any]) -> int:
    """A classifier's label count: `num_labels`, else the size of `id2label` (what
    transformers saves)."""
    if "num_labels" in raw:
        return positive_int(raw, "num_labels")
    id2label = raw.get("id2label") or {}
    if not id2label:
        raise ContractError("id2label", "a classification model needs id2label or num_labels")
    return len(id2label)


def one_architecture(raw: dict[str, Any], default: str, known: Collection[str]) -> str:
    """config.json's single `architectures` entry (`default` when absent), one of `known`."""
    architectures = raw.get("architectures") or [default]
    if not isinstance(architectures, list) or len(architectures) != 1:
        raise ContractError("architectures", f"expected one architecture, got {architectures!r}")
    architecture = architectures[0]
    if architecture not in known:
        names = ", ".join(sorted(known))
        raise ContractError("architectures", f"{architecture!r} is not supported; known: {names}")
    return architecture
