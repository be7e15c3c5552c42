"""The packages layer is laid over a kept root for the checks and taken away after."""

import pytest

from images import layers, smoke


def test_laid_over_removes_exactly_what_it_added(tmp_path):
    root = tmp_path / "root"
    (root / "opt/venv/lib").mkdir(parents=True)
    (root / "opt/venv/lib/kept.py").write_text("kept\n")
    source = tmp_path / "big.gguf"
    source.write_bytes(b"weights")
    entries = [
        layers.Entry("opt/venv/lib/pkg/__init__.py", b"x = 1\n", 0o644),
        layers.Entry("opt/venv/lib/pkg/model.gguf", source, 0o644),
        layers.Entry("opt/venv/bin/run", b"#!/bin/sh\n", 0o755),
    ]
    with smoke.laid_over(root, entries):
        assert (root / "opt/venv/lib/pkg/model.gguf").read_bytes() == b"weights"
        assert (root / "opt/venv/bin/run").stat().st_mode & 0o777 == 0o755
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) == [
        "opt", "opt/venv", "opt/venv/lib", "opt/venv/lib/kept.py",
    ]  # fmt: skip


def test_laid_over_never_overwrites_the_root(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/passwd").write_text("root:x:0:0::/root:/bin/sh\n")
    entries = [layers.Entry("etc/group", b"", 0o644), layers.Entry("etc/passwd", b"", 0o644)]
    with pytest.raises(FileExistsError, match="etc/passwd"):
        with smoke.laid_over(tmp_path, entries):
            pass
    assert (tmp_path / "etc/passwd").read_text().startswith("root:")
    assert not (tmp_path / "etc/group").exists()  # laid before the failure, taken away
