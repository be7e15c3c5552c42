"""SiLU-and-mul: the Triton kernel (interpreted) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from batching_engine.kernels._launch import KernelInputError
from batching_engine.kernels.silu_and_mul import silu_and_mul_reference, silu_and_mul_triton
from tests.batching_engine.kernels.tensors import (
    DTYPE_IDS,
    DTYPES,
    TOLERANCES,
    generator,
    poisoned,
    randn,
)

pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("shape", [(7, 2 * 40), (3, 2 * 1100), (2, 3, 2 * 16)], ids=str)
def test_gate_half_through_silu_times_the_up_half(dtype, shape):
    # 1100 columns span two program blocks of 1024; the 3-D input flattens its leading dims.
    x = randn(*shape, dtype=dtype, gen=generator(sum(shape)))
    out = poisoned(*shape[:-1], shape[-1] // 2, dtype=dtype)
    actual = silu_and_mul_triton(x, out)
    torch.testing.assert_close(actual, silu_and_mul_reference(x), **TOLERANCES[dtype])


def test_rows_are_read_through_their_stride():
    wide = randn(4, 100, dtype=torch.float32, gen=generator(0))
    x = wide[:, :64]
    torch.testing.assert_close(silu_and_mul_triton(x), silu_and_mul_reference(x))


def test_an_odd_last_dimension_is_refused():
    with pytest.raises(KernelInputError, match="x: last dimension must be even"):
        silu_and_mul_triton(torch.zeros(2, 7))
