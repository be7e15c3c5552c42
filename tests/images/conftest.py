"""Fixtures of the image tests: the project's pyproject.toml, and a small tree of packages."""

import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture
def tree(tmp_path) -> tuple[Path, dict]:
    """A repository with two packages, one in a folder of its own, and a data file."""
    (tmp_path / "alpha" / "sub").mkdir(parents=True)
    (tmp_path / "alpha" / "__init__.py").write_text("")
    (tmp_path / "alpha" / "main.py").write_text("def main():\n    return 0\n")
    (tmp_path / "alpha" / "sub" / "__init__.py").write_text("")
    (tmp_path / "alpha" / "sub" / "api.proto").write_text("syntax = 'proto3';\n")
    (tmp_path / "nested" / "beta").mkdir(parents=True)
    (tmp_path / "nested" / "beta" / "__init__.py").write_text("X = 1\n")
    pyproject = {"tool": {"hatch": {"build": {"targets": {"wheel": {
        "packages": ["alpha", "nested/beta"]
    }}}}}}  # fmt: skip
    return tmp_path, pyproject
