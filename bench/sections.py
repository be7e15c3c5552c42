"""`--sections a,b`: the part of a GPU bench to run, checked against the bench's own list."""

from __future__ import annotations

import argparse
from collections.abc import Sequence


def add_sections_flag(parser: argparse.ArgumentParser, sections: Sequence[str]) -> None:
    parser.add_argument("--sections", default=",".join(sections), help="comma-separated subset")


def chosen_sections(
    parser: argparse.ArgumentParser, args: argparse.Namespace, sections: Sequence[str]
) -> list[str]:
    """The sections asked for, in the order given; an unknown one ends the run naming it."""
    chosen = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = set(chosen) - set(sections)
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; choose from {', '.join(sections)}")
    return chosen
