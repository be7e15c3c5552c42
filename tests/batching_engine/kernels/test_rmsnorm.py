"""Fused residual-add + RMSNorm: the Triton kernel (interpreted) against the torch reference."""

from __future__ import annotations

import pytest
import torch

from batching_engine.kernels._launch import KernelInputError
from batching_engine.kernels.rmsnorm import fused_add_rmsnorm_reference, fused_add_rmsnorm_triton
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
@pytest.mark.parametrize("hidden", [64, 48, 1000])
def test_add_then_norm_returns_the_normed_sum_and_the_sum(dtype, hidden):
    gen = generator(hidden)
    x, residual = randn(5, hidden, dtype=dtype, gen=gen), randn(5, hidden, dtype=dtype, gen=gen)
    weight = randn(hidden, dtype=dtype, gen=gen)
    out, new_residual = poisoned(5, hidden, dtype=dtype), poisoned(5, hidden, dtype=dtype)
    actual = fused_add_rmsnorm_triton(x, residual, weight, 1e-6, out, new_residual)
    expected = fused_add_rmsnorm_reference(x, residual, weight, 1e-6)
    torch.testing.assert_close(actual[0], expected[0], **TOLERANCES[dtype])
    torch.testing.assert_close(actual[1], expected[1], **TOLERANCES[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_without_a_residual_the_input_is_the_new_residual(dtype):
    gen = generator(1)
    x, weight = randn(3, 64, dtype=dtype, gen=gen), randn(64, dtype=dtype, gen=gen)
    out, residual = fused_add_rmsnorm_triton(x, None, weight, 1e-5, poisoned(3, 64, dtype=dtype))
    assert residual is x
    torch.testing.assert_close(
        out, fused_add_rmsnorm_reference(x, None, weight, 1e-5)[0], **TOLERANCES[dtype]
    )


def test_residual_updated_in_place_and_rows_read_through_their_stride():
    gen = generator(2)
    wide = randn(4, 96, dtype=torch.float32, gen=gen)
    x = wide[:, :64]  # rows 96 apart
    residual = randn(4, 64, dtype=torch.float32, gen=gen)
    weight = randn(64, dtype=torch.float32, gen=gen)
    expected = fused_add_rmsnorm_reference(x, residual, weight, 1e-6)
    out, new_residual = fused_add_rmsnorm_triton(x, residual, weight, 1e-6, residual_out=residual)
    assert new_residual is residual
    torch.testing.assert_close(residual, expected[1])
    torch.testing.assert_close(out, expected[0])


def test_a_weight_of_the_wrong_size_is_refused():
    with pytest.raises(KernelInputError, match="weight: dimension 0 is 32, expected 64"):
        fused_add_rmsnorm_triton(torch.zeros(2, 64), None, torch.ones(32), 1e-6)
