"""Kernel tests run every Triton kernel on the CPU through Triton's interpreter.

The interpreter is chosen when a function is decorated with `triton.jit`, including Triton's own
library functions (`tl.sigmoid`, ...), which are decorated when triton is imported. So the switch
must be on before anything imports triton: this conftest sets it at import, and pytest imports it
before any test module of this directory.
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"

import pytest  # noqa: E402
import triton.language as tl  # noqa: E402

from batching_engine.kernels._launch import is_interpreted  # noqa: E402
from batching_engine.kernels.rmsnorm import _fused_add_rmsnorm_kernel  # noqa: E402


@pytest.fixture(scope="session")
def triton_interpreter() -> None:
    """Fail clearly, not with a CUDA error, when triton was imported before this conftest."""
    if not (is_interpreted(_fused_add_rmsnorm_kernel) and is_interpreted(tl.sigmoid)):
        pytest.fail(
            "triton was imported before TRITON_INTERPRET=1 was set, so the kernels are compiled "
            "for a GPU; run `TRITON_INTERPRET=1 pytest tests/batching_engine/kernels`"
        )
