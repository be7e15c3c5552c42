"""Every kernel, as its launcher would run it on a GPU, compiles to a cubin for sm_80 (A100) and
sm_90 (H100/H200) with Triton's own compiler, no GPU needed.

It runs in subprocesses: this directory's conftest turned on Triton's interpreter, under which
`triton.jit` gives Python functions that the compiler cannot take.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.batching_engine.kernels import aot_compile

ROOT = Path(__file__).resolve().parents[3]


def compile_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"  # the default; set to silence its warning
    return env


def test_every_kernel_compiles_for_sm80_and_sm90():
    command = [sys.executable, "-m", "tests.batching_engine.kernels.aot_compile"]
    runs = {
        arch: subprocess.Popen(
            [*command, str(arch)],
            cwd=ROOT,
            env=compile_env(),
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for arch in (80, 90)
    }
    outputs = {arch: run.communicate(timeout=240)[0] for arch, run in runs.items()}
    for arch, output in outputs.items():
        assert runs[arch].returncode == 0, output
        compiled = [line for line in output.splitlines() if line.startswith(f"ok   sm_{arch} ")]
        assert len(compiled) == len(aot_compile.all_cases()), output
        assert "compiler rejects tl.dot with K=8: yes" in output, output
