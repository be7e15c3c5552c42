"""Rotary embedding (HF rotate_half layout): the Triton kernel (interpreted) against the torch
reference, and the reference against the rotation it stands for."""

from __future__ import annotations

import pytest
import torch

from batching_engine.kernels._launch import KernelInputError
from batching_engine.kernels.rotary import rotary_embedding_reference, rotary_embedding_triton
from tests.batching_engine.kernels.tensors import (
    DTYPE_IDS,
    DTYPES,
    TOLERANCES,
    generator,
    poisoned,
    randn,
)

pytestmark = pytest.mark.usefixtures("triton_interpreter")
MAX_POSITION = 64


def tables(rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's layout: angles for each frequency, repeated for the two halves."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    angles = torch.arange(MAX_POSITION).float()[:, None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def inputs(dtype, heads, kv_heads, head_dim, rotary_dim, seed=0):
    gen = generator(seed)
    positions = torch.tensor([0, 1, 17, MAX_POSITION - 1, 5])
    q = randn(5, heads, head_dim, dtype=dtype, gen=gen)
    k = randn(5, kv_heads, head_dim, dtype=dtype, gen=gen)
    return positions, q, k, *tables(rotary_dim)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(
    "heads, kv_heads, head_dim, rotary_dim",
    [(4, 2, 32, 32), (6, 2, 64, 32), (3, 3, 24, 24)],
    ids=["gqa", "partial-rotary", "odd-half"],
)
def test_rotates_q_and_k_like_the_reference(dtype, heads, kv_heads, head_dim, rotary_dim):
    positions, q, k, cos, sin = inputs(dtype, heads, kv_heads, head_dim, rotary_dim)
    q_out, k_out = poisoned(*q.shape, dtype=dtype), poisoned(*k.shape, dtype=dtype)
    actual = rotary_embedding_triton(positions, q, k, cos, sin, q_out, k_out)
    expected = rotary_embedding_reference(positions, q, k, cos, sin)
    torch.testing.assert_close(actual[0], expected[0], **TOLERANCES[dtype])
    torch.testing.assert_close(actual[1], expected[1], **TOLERANCES[dtype])


def test_in_place_on_strided_views_of_a_fused_qkv():
    gen = generator(3)
    qkv = randn(5, (4 + 2 + 2) * 32, dtype=torch.float32, gen=gen)
    q = qkv[:, : 4 * 32].view(5, 4, 32)
    k = qkv[:, 4 * 32 : 6 * 32].view(5, 2, 32)
    positions, cos, sin = torch.tensor([3, 0, 9, 2, 63]), *tables(32)
    expected = rotary_embedding_reference(positions, q.clone(), k.clone(), cos, sin)
    rotary_embedding_triton(positions, q, k, cos, sin, q_out=q, k_out=k)
    torch.testing.assert_close(q, expected[0])
    torch.testing.assert_close(k, expected[1])


def test_reference_rotates_each_pair_of_halves_by_position_times_frequency():
    positions, q, k, cos, sin = inputs(torch.float32, 1, 1, 8, 8)
    rotated, _ = rotary_embedding_reference(positions, q, k, cos, sin)
    token, pair = 2, 1  # position 17, frequency 10000 ** (-2/8)
    angle = torch.tensor(17 * 10000 ** (-2 / 8))
    x1, x2 = q[token, 0, pair], q[token, 0, pair + 4]
    want = (x1 * angle.cos() - x2 * angle.sin(), x2 * angle.cos() + x1 * angle.sin())
    torch.testing.assert_close((rotated[token, 0, pair], rotated[token, 0, pair + 4]), want)


def test_an_odd_rotary_dim_is_refused():
    positions, q, k, _, _ = inputs(torch.float32, 2, 2, 16, 16)
    table = torch.zeros(MAX_POSITION, 7)
    with pytest.raises(KernelInputError, match="rotary_dim 7 must be even"):
        rotary_embedding_triton(positions, q, k, table, table)
