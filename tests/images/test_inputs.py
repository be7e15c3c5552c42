"""Source digests: what a wheel would carry, hashed by name and content."""

from pathlib import Path

import pytest

from images import inputs

ROOT = Path(__file__).resolve().parents[2]


def test_package_files_are_every_file_of_the_package(tree):
    root, pyproject = tree
    names = [name for name, _ in inputs.package_files(root, pyproject, "alpha")]
    assert names == ["alpha/__init__.py", "alpha/main.py", "alpha/sub/__init__.py",
                     "alpha/sub/api.proto"]  # fmt: skip
    assert [n for n, _ in inputs.package_files(root, pyproject, "beta")] == ["beta/__init__.py"]


def test_unknown_package_is_named(tree):
    root, pyproject = tree
    with pytest.raises(FileNotFoundError, match="gamma"):
        inputs.package_dir(root, pyproject, "gamma")


def digest_of(root, pyproject):
    return inputs.files_digest(inputs.package_files(root, pyproject, "alpha"))


def test_digest_changes_with_an_edit_an_addition_or_a_rename(tree):
    root, pyproject = tree
    start = digest_of(root, pyproject)
    (root / "alpha" / "main.py").write_text("def main():\n    return 1\n")
    edited = digest_of(root, pyproject)
    assert edited != start
    (root / "alpha" / "extra.py").write_text("")
    added = digest_of(root, pyproject)
    assert added != edited
    (root / "alpha" / "extra.py").rename(root / "alpha" / "other.py")
    assert digest_of(root, pyproject) != added


def test_digest_ignores_bytecode_and_files_no_wheel_carries(tree):
    root, pyproject = tree
    start = digest_of(root, pyproject)
    (root / "alpha" / "__pycache__").mkdir()
    (root / "alpha" / "__pycache__" / "main.cpython-311.pyc").write_bytes(b"\0")
    (root / "alpha" / "sub" / "stale.pyc").write_bytes(b"\0")
    (root / "notes.txt").write_text("outside every package\n")
    (root / "alpha" / "main.py").touch()
    assert digest_of(root, pyproject) == start


def test_project_packages_are_found(pyproject):
    assert inputs.package_dir(ROOT, pyproject, "inference_operator").parent.name == "operator"
    names = [n for n, _ in inputs.package_files(ROOT, pyproject, "device_plugin")]
    assert "device_plugin/kubelet/v1beta1/api.proto" in names


def test_digest_parts_are_separated():
    assert inputs.digest("ab", "c") != inputs.digest("a", "bc")
