"""Typed readers of one JSON value each, for request bodies: a wrong value is a 400.

Each reader takes the value and its path in the body (`messages[2].content`) and returns
the value checked, or raises a `RequestError` naming that path. Booleans are not numbers,
NaN and infinities are not numbers either, and an integer too large for a float is
compared exactly rather than overflowing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from infergrid.errors import ContractError


class RequestError(ContractError):
    """A client's mistake in one field; the app turns it into an OpenAI-style 400."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(field, message)
        self.message = f"{field}: {message}"


Reader = Callable[[object, str], Any]


def optional(doc: dict[str, Any], key: str, read: Reader, path: str | None = None) -> Any:
    """`doc[key]` read, or None when absent or null (OpenAI's clients send explicit nulls)."""
    value = doc.get(key)
    return None if value is None else read(value, path or key)


def value_or(doc: dict[str, Any], key: str, read: Reader, default: Any) -> Any:
    value = optional(doc, key, read)
    return default if value is None else value


def required(doc: dict[str, Any], key: str, read: Reader, path: str) -> Any:
    if doc.get(key) is None:
        raise RequestError(path, "is required")
    return read(doc[key], path)


def body(doc: object) -> dict[str, Any]:
    return mapping(doc, "body")


def mapping(value: object, path: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise RequestError(path, f"expected an object, got {kind(value)}")
    return value


def array(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise RequestError(path, f"expected a list, got {kind(value)}")
    return value


def text(value: object, path: str) -> str:
    """A string of Unicode text. JSON may escape a lone UTF-16 surrogate (`"\\ud800"`),
    which decodes to a Python string no tokenizer can encode: refused here, naming the field,
    rather than failing deep in the tokenizer."""
    if not isinstance(value, str):
        raise RequestError(path, f"expected a string, got {kind(value)}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as err:
            raise RequestError(
                path,
                f"holds a lone surrogate U+{ord(value[err.start]):04X} at character "
                f"{err.start}, which is not text (a surrogate is only half of a pair)",
            ) from None
    return value


def string(value: object, path: str) -> str:
    if not text(value, path):
        raise RequestError(path, "must not be empty")
    return value  # type: ignore[return-value]


def boolean(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise RequestError(path, f"expected a boolean, got {kind(value)}")
    return value


def integer(low: int, high: int) -> Reader:
    def read(value: object, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(path, f"expected an integer, got {kind(value)}")
        if not low <= value <= high:
            raise RequestError(path, f"must be from {low} to {high}, got {value}")
        return value

    return read


def number(low: float, high: float) -> Reader:
    def read(value: object, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RequestError(path, f"expected a number, got {kind(value)}")
        # Compared before float(): an integer too large for a float must give a 400.
        if (isinstance(value, float) and not math.isfinite(value)) or not low <= value <= high:
            raise RequestError(path, f"must be from {low:g} to {high:g}, got {value}")
        return float(value)

    return read


def fraction(value: object, path: str) -> float:
    """Above 0, at most 1 (top_p: at 0 nothing would be left to sample)."""
    share = number(0.0, 1.0)(value, path)
    if share == 0.0:
        raise RequestError(path, "must be above 0")
    return share


def tokens(value: object, path: str) -> list[int]:
    items = array(value, path)
    if not items:
        raise RequestError(path, "must not be empty")
    for i, token in enumerate(items):
        if isinstance(token, bool) or not isinstance(token, int) or token < 0:
            raise RequestError(f"{path}[{i}]", "must be a token id (an integer, 0 or more)")
    return list(items)


def kind(value: object) -> str:
    names = {
        str: "string",
        bool: "boolean",
        int: "integer",
        float: "number",
        list: "list",
        dict: "object",
        type(None): "null",
    }
    return names.get(type(value), type(value).__name__)


def reject_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON value")
