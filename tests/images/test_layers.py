"""Layer tars written here: the same bytes for the same input, root-owned, parents first."""

import tarfile

from images import components, layers


def entries():
    return [
        layers.Entry("usr/local/bin/tool", b"#!/bin/sh\n", 0o755),
        layers.Entry("tmp", None, 0o1777),
    ]


def test_tar_is_reproducible_and_normalised(tmp_path):
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    layers.write_tar(a, entries())
    layers.write_tar(b, list(reversed(entries())))
    assert a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as t:
        members = t.getmembers()
    assert [m.name for m in members] == ["tmp", "usr", "usr/local", "usr/local/bin",
                                         "usr/local/bin/tool"]  # fmt: skip
    assert all(m.uid == 0 and m.gid == 0 and m.mtime == 0 for m in members)
    assert members[0].mode == 0o1777 and members[-1].mode == 0o755


def test_console_script_runs_the_function():
    script = layers.console_script("batching_engine.main:main").decode()
    assert script.startswith(f"#!{components.VENV}/bin/python\n")
    assert "from batching_engine.main import main" in script
    assert "sys.exit(main())" in script


def test_app_entries_hold_packages_bytecode_and_scripts(pyproject, tree):
    root, _ = tree
    image = components.images(pyproject)["operator"]
    files = {
        "infergrid": [("infergrid/__init__.py", root / "alpha" / "__init__.py")],
        "inference_operator": [("inference_operator/main.py", root / "alpha" / "main.py")],
    }
    paths = {e.path: e for e in layers.app_entries(image, files)}
    site = components.SITE_PACKAGES.lstrip("/")
    assert f"{site}/inference_operator/main.py" in paths
    pyc = layers.cache_file(f"/{site}/inference_operator/main.py")
    if pyc:  # this interpreter is the image's Python
        assert paths[pyc.lstrip("/")].data[4:8] == (0b01).to_bytes(4, "little")  # unchecked hash
    script = paths[f"{components.VENV.lstrip('/')}/bin/infergrid-operator"]
    assert script.mode == 0o755 and b"inference_operator.main" in script.data
    assert f"{components.VENV.lstrip('/')}/bin/infergrid" in paths


def test_a_target_install_is_carried_without_the_console_scripts_pip_wrote(tmp_path):
    """A model package's CLI (pip's bin/) points at this machine's Python; the image has its
    own entry points and never runs it."""
    (tmp_path / "model_pkg").mkdir()
    (tmp_path / "model_pkg" / "model.zip").write_bytes(b"zip")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "model-cli").write_text("#!/usr/bin/python3\n")
    names = [e.path for e in layers.target_entries(tmp_path)]
    assert names == [f"{components.SITE_PACKAGES}/model_pkg/model.zip".lstrip("/")]
