"""Typed readers for JSON and YAML documents, shared by every decoder.

Each reader checks one value and, when it is wrong, raises a ContractError that
names the full path of the field (``gpus[2].memoryMiB``), so every decoder
reports bad input the same way and none of them lets a KeyError or TypeError out.
"""

import json
import re
from collections.abc import Hashable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, TypeVar, cast

from infergrid.constants import SCHEMA_VERSION
from infergrid.errors import ContractError

T = TypeVar("T")
_MISSING: Final = object()

_KIND_NAMES: Final = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "list",
    dict: "object",
    type(None): "null",
}
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def join(path: str, key: str | int) -> str:
    """The path of ``key`` inside ``path``: ``a.b`` for names, ``a[0]`` or ``a[x/y]`` otherwise."""
    if isinstance(key, str) and _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key}]"


def _kind_name(kind: type) -> str:
    return _KIND_NAMES.get(kind, kind.__name__)


def expect(value: object, kind: type[T], path: str) -> T:
    """``value`` if it is a ``kind``; booleans are not integers, strings are not empty."""
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ContractError(path, f"expected {_kind_name(kind)}, got {_kind_name(type(value))}")
    if isinstance(value, str) and not value:
        raise ContractError(path, "must not be empty")
    return value


def field(
    obj: Mapping[str, Any], key: str, kind: type[T], path: str = "", default: Any = _MISSING
) -> T:
    """``obj[key]`` as a ``kind``; an absent or null key gives ``default`` when one is given."""
    value = obj.get(key)
    if value is None and default is not _MISSING:
        return cast(T, default)
    if key not in obj:
        raise ContractError(join(path, key), "is required")
    return expect(value, kind, join(path, key))


def integer(
    obj: Mapping[str, Any],
    key: str,
    path: str = "",
    low: int = 0,
    high: int | None = None,
    default: Any = _MISSING,
) -> int:
    """``obj[key]`` as an integer from ``low`` to ``high`` (inclusive)."""
    value = field(obj, key, int, path, default)
    if value < low or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"from {low} to {high}"
        raise ContractError(join(path, key), f"must be {bound}, got {value}")
    return value


def each(
    obj: Mapping[str, Any], key: str, kind: type[T], path: str = "", default: Any = _MISSING
) -> list[tuple[T, str]]:
    """The items of the list ``obj[key]``, each checked as a ``kind`` and paired with its path."""
    items = field(obj, key, list, path, default)
    where = join(path, key)
    return [(expect(item, kind, join(where, i)), join(where, i)) for i, item in enumerate(items)]


def one_of(doc: Mapping[str, Any], key: str, options: tuple, path: str, default: Any) -> Any:
    """`doc[key]`, one of `options`; absent or null gives `default` (which may be None)."""
    value = field(doc, key, str, path, default)
    if value is not None and value not in options:
        raise ContractError(join(path, key), f"{value!r} is not one of {', '.join(options)}")
    return value


def reject_unknown(obj: Mapping[str, Any], allowed: Iterable[str], path: str = "") -> None:
    """Fail on a key outside ``allowed``: in a hand-written file a typo must not pass unseen."""
    known = set(allowed)
    for key in obj:
        if key not in known:
            raise ContractError(
                join(path, str(key)), f"unknown field; expected one of {sorted(known)}"
            )


def unique(keyed: Iterable[tuple[Hashable, str]], what: str) -> None:
    """Fail at the path of the second occurrence of any key."""
    seen: set[Hashable] = set()
    for key, path in keyed:
        if key in seen:
            raise ContractError(path, f"{what} {key!r} appears more than once")
        seen.add(key)


def check_version(doc: Mapping[str, Any]) -> None:
    """Refuse a document of a schema version this build cannot read, rather than misread it."""
    version = field(doc, "version", str)
    if version != SCHEMA_VERSION:
        raise ContractError(
            "version", f"unsupported {version!r}; this build reads {SCHEMA_VERSION!r}"
        )


def load_document(text: str, what: str) -> dict[str, Any]:
    """Parse a versioned JSON document; ``what`` names it in errors about the whole text."""
    try:
        doc = json.loads(text)
    except (ValueError, TypeError, RecursionError) as error:
        raise ContractError(what, f"not valid JSON: {error}") from None
    doc = expect(doc, dict, what)
    check_version(doc)
    return doc


def dump_document(body: Mapping[str, Any]) -> str:
    """Compact, key-sorted JSON with the schema version, so equal values encode equally."""
    doc = {"version": SCHEMA_VERSION, **body}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def encode_time(moment: datetime, path: str) -> str:
    """RFC 3339 in UTC with a ``Z``; a naive time has no meaning across machines."""
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ContractError(path, "time must be timezone-aware")
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def decode_time(obj: Mapping[str, Any], key: str, path: str = "") -> datetime:
    """A timezone-aware RFC 3339 time, converted to UTC."""
    text = field(obj, key, str, path)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ContractError(join(path, key), f"{text!r} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        raise ContractError(join(path, key), f"{text!r} has no timezone; use Z for UTC")
    return moment.astimezone(UTC)
