"""`python -m images.lock` writes images/locks/<group>.txt for every pip group of the images
and for pip itself (the installer that runs in the image's root, never installed there);
`--check` says, offline, whether the committed locks still hold pyproject.toml's pins.

pip resolves each group for the image's platform (`install --dry-run --report`, CPython
3.11, manylinux up to glibc 2.36, wheels only, nothing of this machine's installed), and
its report gives each wheel's sha256. Groups stack as the image's layers do: a group is
resolved with the exact pins of the groups under it and its lock holds only what they do
not; a `--no-deps` group (the model packages) locks exactly its requirements.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from . import components, lockfile, python_layers, runtime_only
from .build import read_pyproject
from .components import PIP, PipGroup, PythonImage
from .lockfile import Pin

INSTALLER = "pip"
Resolver = Callable[[tuple[str, ...], bool], list[Pin]]


def groups(pyproject: dict) -> list[PipGroup]:
    """The installer, then every image's pip groups by name, in the order they stack."""
    found: dict[str, PipGroup] = {}
    for image in components.images(pyproject).values():
        if isinstance(image, PythonImage):
            for group in image.pip_groups:
                found.setdefault(group.name, group)
    return [PipGroup(INSTALLER, (PIP,), no_deps=True), *found.values()]


def report_argv(python: str, requirements: tuple[str, ...], report: Path, no_deps: bool):
    """pip's resolution for the image's Python and platform, written as a JSON report."""
    argv = [python, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
            f"--report={report}", "--progress-bar=off", "--disable-pip-version-check",
            *python_layers.image_wheels()]  # fmt: skip
    return argv + (["--no-deps"] if no_deps else []) + list(requirements)


def pins_of(report: dict) -> list[Pin]:
    """Name, version and wheel sha256 of every package the report would install."""
    pins = []
    for item in report["install"]:
        meta, info = item["metadata"], item["download_info"]
        sha256 = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if not sha256:
            raise ValueError(f"pip's report gives no sha256 for {meta['name']} ({info['url']})")
        pins.append(lockfile.pin(meta["name"], meta["version"], sha256))
    return pins


def resolve(requirements: tuple[str, ...], no_deps: bool) -> list[Pin]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        argv = report_argv(sys.executable, requirements, report, no_deps)
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"pip could not resolve {requirements}:\n{done.stderr[-3000:]}")
        return pins_of(json.loads(report.read_text()))


def header(group: PipGroup, under: list[str], left_out: list[str]) -> list[str]:
    lines = [
        f"The {group.name!r} pip group of the images: every package, pinned with the sha256",
        f"of its wheel for the image (CPython {components.PYTHON}, manylinux up to glibc "
        f"2.{python_layers.GLIBC_MINOR}).",
        "Made by `python -m images.lock` (needs the package index); do not edit.",
    ]
    if group.name == INSTALLER:
        lines.append("pip runs from this wheel inside the image's root; it is never installed.")
    elif group.no_deps:
        lines.append("Installed with --no-deps: exactly these packages, nothing they require.")
    elif under:
        names = ", ".join(f"{n}.txt" for n in under)
        lines.append(f"Resolved over the exact pins of {names}; holds only what they do not.")
    if left_out:
        lines.append(
            f"Left out, build- or test-only (images/runtime_only.py): {', '.join(left_out)}."
        )
    return lines


def left_out(group: PipGroup, pins: list[Pin], banned: frozenset[str]) -> list[str]:
    """The banned packages the group requires only transitively."""
    direct = {lockfile.requirement_pin(r)[0] for r in group.requirements}
    return runtime_only.present([p.name for p in pins if p.name not in direct], banned)


def generate(pyproject: dict, resolver: Resolver = resolve) -> dict[str, str]:
    """The text of every group's lock, by group name. A build- or test-only package that
    a group needs only transitively is left out (torch requires setuptools, for building
    C++ extensions, which the engine never does); a direct one fails `check`."""
    banned = runtime_only.forbidden(pyproject)
    texts: dict[str, str] = {}
    under: list[str] = []
    below: list[Pin] = []
    for group in groups(pyproject):
        if group.no_deps:
            pins = resolver(group.requirements, True)
        else:
            stacked = tuple(p.requirement for p in below) + group.requirements
            have = {p.name for p in below}
            pins = [p for p in resolver(stacked, False) if p.name not in have]
        dropped = [] if group.name == INSTALLER else left_out(group, pins, banned)
        pins = [p for p in pins if p.name not in dropped]
        texts[group.name] = lockfile.render(header(group, under, dropped), pins)
        if not group.no_deps:
            under.append(group.name)
            below += pins
    return texts


def check(pyproject: dict, texts: dict[str, str | None]) -> list[str]:
    """What is wrong with the locks (text None: no lock), or nothing."""
    problems: list[str] = []
    banned = runtime_only.forbidden(pyproject)
    below: dict[str, str] = {}  # name -> the lock under it that has it
    for group in groups(pyproject):
        source = f"images/locks/{group.name}.txt"
        text = texts.get(group.name)
        if text is None:
            problems.append(f"{source} is missing: run python -m images.lock")
            continue
        try:
            pins = lockfile.parse(text, source)
        except ValueError as e:
            problems.append(str(e))
            continue
        problems += [f"{source}: {p}" for p in lockfile.missing_pins(pins, group.requirements)]
        names = [p.name for p in pins]
        if group.no_deps:
            direct = {lockfile.requirement_pin(r)[0] for r in group.requirements}
            problems += [f"{source}: {n} is not a requirement" for n in names if n not in direct]
        else:
            problems += [f"{source}: {n} is in {below[n]} too" for n in names if n in below]
            below.update((n, f"{group.name}.txt") for n in names)
        if group.name != INSTALLER:
            problems += [f"{source}: {n} is build- or test-only" for n in runtime_only.present(
                names, banned)]  # fmt: skip
    return problems


def committed(pyproject: dict) -> dict[str, str | None]:
    paths = {g.name: lockfile.path(g.name) for g in groups(pyproject)}
    return {name: p.read_text() if p.is_file() else None for name, p in paths.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m images.lock", description=__doc__)
    parser.add_argument("--check", action="store_true", help="compare, offline; write nothing")
    args = parser.parse_args(argv)
    pyproject = read_pyproject()
    if not args.check:
        lockfile.LOCKS.mkdir(exist_ok=True)
        for name, text in generate(pyproject).items():
            lockfile.path(name).write_text(text)
            print(f"{lockfile.path(name)}: {len(lockfile.parse(text, name))} packages")
    problems = check(pyproject, committed(pyproject))
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print("the locks hold pyproject.toml's pins")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
