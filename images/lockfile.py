"""The lock files of the image's pip groups (images/locks/<group>.txt): every package,
direct and transitive, as `name==version --hash=sha256:<hex>` of the wheel chosen for the
image's Python and glibc, one a line, sorted. pip reads them as they are (`-r`, with
`--require-hashes`); nothing here does I/O but `read`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

LOCKS = Path(__file__).resolve().parent / "locks"
_LINE = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+) --hash=sha256:([0-9a-f]{64})")


@dataclass(frozen=True, order=True)
class Pin:
    name: str  # canonical: lower case, runs of -_. as one -
    version: str
    sha256: str

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def line(self) -> str:
        return f"{self.requirement} --hash=sha256:{self.sha256}"


def canonical(name: str) -> str:
    """PEP 503's normal form, so that `PyYAML`, `pyyaml` and `py_yaml` compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pin(name: str, version: str, sha256: str) -> Pin:
    return Pin(canonical(name), version, sha256)


def parse(text: str, source: str) -> tuple[Pin, ...]:
    """The pins of a lock's text; a line that is not one names `source` and its number."""
    pins = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        found = _LINE.fullmatch(line)
        if found is None:
            raise ValueError(
                f"{source}:{number}: not `name==version --hash=sha256:<64 hex>`: {raw!r}"
            )
        pins.append(pin(*found.groups()))
    return tuple(pins)


def render(header: list[str], pins: list[Pin]) -> str:
    """A lock's text: the header as comments, then the pins sorted by name."""
    lines = [f"# {h}" if h else "#" for h in header]
    return "\n".join(lines + [p.line for p in sorted(pins)]) + "\n"


def requirement_pin(requirement: str) -> tuple[str, str]:
    """(canonical name, version) of a `name==version` pin of pyproject.toml."""
    name, sep, version = requirement.partition("==")
    if not sep or not version:
        raise ValueError(f"{requirement!r} is not pinned with ==")
    return canonical(name.split("[", 1)[0].strip()), version.split(";", 1)[0].strip()


def missing_pins(pins: tuple[Pin, ...], requirements: tuple[str, ...]) -> list[str]:
    """Each direct requirement the lock lacks, or holds at another version."""
    locked = {p.name: p.version for p in pins}
    problems = []
    for requirement in requirements:
        name, version = requirement_pin(requirement)
        if name not in locked:
            problems.append(f"{requirement} is not in the lock")
        elif locked[name] != version:
            problems.append(f"{requirement} is locked at {locked[name]}")
    return problems


def path(group: str) -> Path:
    return LOCKS / f"{group}.txt"


def read(group: str) -> str:
    """The committed lock of `group`; a missing one says how to make it."""
    try:
        return path(group).read_text()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"no lock for the pip group {group!r} ({path(group)}): run python -m images.lock"
        ) from None
