"""Settings of a long-running part: one versioned YAML file, overridden by flags.

Each part declares its settings once, as a table of `Setting`s; this module
reads the file, adds the flags and checks flag values with the same readers,
so a typo or an out-of-range value fails at start with the field named,
whether it came from the file or the command line.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from infergrid.codec import check_version, expect, field, integer, reject_unknown
from infergrid.constants import SYSTEM_CLASS_PREFIX
from infergrid.errors import ContractError
from infergrid.yamlfile import read_yaml

T = TypeVar("T")
Reader = Callable[[dict[str, Any], str], Any]


@dataclass(frozen=True, slots=True)
class Setting:
    """`key` in the file, `attr` on the settings dataclass, `flag` on the command line."""

    key: str
    attr: str
    read: Reader
    help: str = ""
    boolean: bool = False
    cli: str = ""

    @property
    def flag(self) -> str:
        """`cli` when given, else the attribute: `usage_interval_s` -> `--usage-interval`."""
        return self.cli or "--" + self.attr.replace("_", "-").removesuffix("-s")


def text(doc: dict[str, Any], key: str) -> str:
    return field(doc, key, str)


def path(doc: dict[str, Any], key: str) -> Path:
    return Path(field(doc, key, str))


def boolean(doc: dict[str, Any], key: str) -> bool:
    return field(doc, key, bool)


def names(doc: dict[str, Any], key: str) -> tuple[str, ...]:
    """A list of names, or one comma-separated string (the flag's form)."""
    value = doc[key]
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
        raise ContractError(key, "expected a list of names or a comma-separated string")
    return tuple(i.strip() for i in items if i.strip())


def class_names(never: str) -> Reader:
    """PriorityClass names, refused at start if one is a system-* class: those belong to the
    cluster's own parts, which InferGrid `never` (its words in the refusal) touches."""

    def read(doc: dict[str, Any], key: str) -> tuple[str, ...]:
        classes = names(doc, key)
        system = [c for c in classes if c.startswith(SYSTEM_CLASS_PREFIX)]
        if system:
            raise ContractError(key, f"{system[0]!r}: system-* classes are {never}")
        return classes

    return read


def whole(low: int, high: int | None = None) -> Reader:
    return lambda doc, key: integer(doc, key, low=low, high=high)


def number(low: float = -math.inf, high: float = math.inf) -> Reader:
    def read(doc: dict[str, Any], key: str) -> float:
        value = doc[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ContractError(key, f"expected a number, got {type(value).__name__}")
        if not low <= value <= high:
            raise ContractError(key, f"must be from {low:g} to {high:g}, got {value}")
        return float(value)

    return read


def choice(options: Sequence[str]) -> Reader:
    def read(doc: dict[str, Any], key: str) -> str:
        value = field(doc, key, str)
        if value not in options:
            raise ContractError(key, f"{value!r} is not one of {', '.join(options)}")
        return value

    return read


def parse_settings(doc: object, settings: Sequence[Setting]) -> dict[str, Any]:
    """The attributes a settings document sets, each checked by its reader."""
    doc = expect(doc, dict, "config")
    check_version(doc)
    reject_unknown(doc, ["version", *(s.key for s in settings)])
    return {s.attr: s.read(doc, s.key) for s in settings if s.key in doc}


def add_flags(
    parser: argparse.ArgumentParser,
    settings: Sequence[Setting],
    config_help: str = "YAML settings file (version: v1)",
) -> None:
    """`--config FILE`, then one flag per setting; a flag left out keeps the file's value."""
    parser.add_argument("--config", type=Path, help=config_help)
    for s in settings:
        if s.boolean:
            parser.add_argument(
                s.flag, dest=s.attr, action=argparse.BooleanOptionalAction, default=None,
                help=s.help,
            )  # fmt: skip
        else:
            parser.add_argument(s.flag, dest=s.attr, default=None, help=s.help)


def _from_flag(setting: Setting, raw: object) -> Any:
    """A flag's string, read as if it were the file's value."""
    value: object = raw
    if isinstance(raw, str) and setting.read not in (text, path):
        try:
            value = int(raw)
        except ValueError:
            try:
                value = float(raw)
            except ValueError:
                value = raw
    return setting.read({setting.key: value}, setting.key)


def flag_values(
    settings: Sequence[Setting], args: argparse.Namespace, name_flags: bool = False
) -> dict[str, Any]:
    """The attributes the flags set, each checked by its reader. A bad value is named by the
    file's key, or by the flag with `name_flags` (for a part whose users mostly type flags)."""
    values: dict[str, Any] = {}
    for s in settings:
        raw = getattr(args, s.attr, None)
        if raw is None:
            continue
        try:
            values[s.attr] = _from_flag(s, raw)
        except ContractError as err:
            if not name_flags:
                raise
            raise ContractError(s.flag, err.reason) from None
    return values


def load_settings(
    defaults: T, settings: Sequence[Setting], args: argparse.Namespace, **overrides: Any
) -> T:
    """Defaults, then `overrides` (environment), then the file, then flags."""
    values: dict[str, Any] = {k: v for k, v in overrides.items() if v}
    if getattr(args, "config", None):
        values.update(parse_settings(read_yaml(args.config), settings))
    values.update(flag_values(settings, args))
    return replace(defaults, **values)  # type: ignore[type-var]
