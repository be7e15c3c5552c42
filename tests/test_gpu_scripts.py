"""The GPU scripts run as they are on a lent GPU machine, which has its own Python with torch,
Triton and nvidia-ml-py but not the project's virtualenv (no editable install, maybe no
grpcio-tools, grpcio, protobuf or PyYAML). Here they run in subprocesses with such packages
hidden, and bench/gpu_first_contact.sh runs its dry run (CPU) through every step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = (
    "versions",
    "nvml_probe",
    "real_nvml_tests",
    "kernels_correctness",
    "cuda_graphs_decode",
    "engine_decode",
    "memory_budget",
    "shared_gpu_memory",
    "shared_gpu_mps",
)
# What a GPU machine may lack; the real-NVML tests and the NVML probe's fake path need none.
NOT_ON_A_GPU_MACHINE = ("grpc_tools", "grpc", "google", "yaml", "kopf", "kubernetes")


def hiding(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment whose Python cannot import `modules` (as if not installed) and has no
    project on its path: a sitecustomize marks them absent in sys.modules, where both import
    and importlib.util.find_spec see them missing."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import sys\nfor name in {modules!r}:\n    sys.modules[name] = None\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return env | {"PYTHONPATH": str(site)}


def run(args: list[str], env: dict[str, str], cwd: Path = ROOT, timeout: int = 120):
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def test_the_real_nvml_tests_pass_without_grpc_protobuf_or_yaml(tmp_path):
    env = hiding(tmp_path, *NOT_ON_A_GPU_MACHINE)
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    done = run([*args, "tests/device_plugin/test_real_nvml.py"], env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert " passed" in done.stdout


def test_the_nvml_probe_prints_versions_first_and_runs_from_anywhere(tmp_path):
    env = hiding(tmp_path, *NOT_ON_A_GPU_MACHINE[:2])
    script = ROOT / "bench" / "nvml_probe.py"
    fleet = ROOT / "e2e" / "fleets" / "sample.yaml"
    done = run([sys.executable, str(script), "--fake", str(fleet)], env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("versions: python=")
    assert '"gpus"' in done.stdout


def test_without_pynvml_the_probe_says_so_after_the_versions(tmp_path):
    env = hiding(tmp_path, "pynvml")
    done = run([sys.executable, "-m", "bench.nvml_probe"], env)
    assert done.returncode == 1
    assert done.stdout.startswith("versions: python=")
    assert "driver=missing" in done.stdout
    assert "no NVML here" in done.stderr


def test_without_torch_the_kernel_bench_says_so_after_the_versions(tmp_path):
    env = hiding(tmp_path, "torch")
    done = run([sys.executable, "-m", "bench.kernels_gpu", "--dry-run"], env)
    assert done.returncode == 2
    assert done.stdout.startswith("versions: python=")
    assert "torch is missing" in done.stderr


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    out = tmp_path_factory.mktemp("gpu-first-contact")
    env = dict(os.environ) | {"OUT": str(out), "PYTHON": sys.executable}
    done = run(["bash", "bench/gpu_first_contact.sh", "--dry-run"], env, timeout=600)
    return done, out


def test_the_first_contact_dry_run_passes_every_step(dry_run):
    done, out = dry_run
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    logs = sorted(path.name for path in out.glob("*.log"))
    assert logs == [f"{i:02d}-{name}.log" for i, name in enumerate(STEPS, start=1)]
    summary = (out / "summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in summary] == [[name, "pass"] for name in STEPS]
    assert "summary (" in done.stdout


def test_the_dry_run_logs_show_what_each_step_did(dry_run):
    _, out = dry_run
    assert "versions: python=" in (out / "01-versions.log").read_text()
    assert "discovered" in (out / "02-nvml_probe.log").read_text()
    assert " passed" in (out / "03-real_nvml_tests.log").read_text()
    for name in STEPS[3:]:
        assert "sections with errors: none" in next(out.glob(f"*-{name}.log")).read_text(), name
    assert "KV cache" in (out / "07-memory_budget.log").read_text()
    memory = (out / "08-shared_gpu_memory.log").read_text()
    assert "simulated GPU" in memory and "time_sliced" in memory
    assert memory.count("since before this process's context") == 4  # A and B, twice
    mps = (out / "09-shared_gpu_mps.log").read_text()
    assert mps.count("an MPS client within its pinned limit") == 2
    assert "simulated: CPU engines and no MPS" in mps
    assert "OutOfMemoryError" in mps and mps.count("completion 200") == 2


def test_an_unknown_argument_is_refused():
    done = run(["bash", "bench/gpu_first_contact.sh", "--fast"], dict(os.environ))
    assert done.returncode == 2
    assert "usage:" in done.stderr
