"""Dispatch: the Triton path on CUDA tensors, the torch reference elsewhere, one switch to force
either, and an unknown switch value refused when the module loads."""

from __future__ import annotations

import importlib

import pytest
import torch

from batching_engine.kernels import dispatch
from batching_engine.kernels.silu_and_mul import silu_and_mul_reference
from tests.batching_engine.kernels.tensors import generator, randn

pytestmark = pytest.mark.usefixtures("triton_interpreter")


@pytest.fixture
def backend():
    """Restore the switch after each test: it is process-wide."""
    before = dispatch.kernel_backend()
    yield dispatch.set_kernel_backend
    dispatch.set_kernel_backend(before)


def test_auto_takes_the_torch_path_for_cpu_tensors(backend):
    backend("auto")
    assert not dispatch.uses_triton(torch.zeros(1))


@pytest.mark.parametrize("forced, triton", [("triton", True), ("torch", False), (" Torch ", False)])
def test_the_switch_forces_one_path_whatever_the_device(backend, forced, triton):
    backend(forced)
    assert dispatch.uses_triton(torch.zeros(1)) is triton


def test_forced_triton_runs_the_kernel_on_cpu_under_the_interpreter(backend):
    x = randn(3, 2 * 40, dtype=torch.float32, gen=generator(0))
    backend("triton")
    torch.testing.assert_close(dispatch.silu_and_mul(x), silu_and_mul_reference(x))


def test_both_paths_agree_on_a_layer_of_calls(backend):
    """The model's whole per-layer sequence of calls, once per path, on the same inputs."""
    gen = generator(1)
    x = randn(3, 32, dtype=torch.float32, gen=gen)
    weight = randn(32, dtype=torch.float32, gen=gen)
    q, k, v = (randn(3, h, 16, dtype=torch.float32, gen=gen) for h in (4, 2, 2))
    cos, sin = (
        randn(8, 16, dtype=torch.float32, gen=gen),
        randn(8, 16, dtype=torch.float32, gen=gen),
    )
    positions = torch.tensor([0, 1, 2])

    def layer() -> list[torch.Tensor]:
        k_cache = torch.zeros(2, 4, 2, 16)
        v_cache = torch.zeros(2, 4, 2, 16)
        tables = torch.tensor([[1, 0]], dtype=torch.int32)
        normed, residual = dispatch.fused_add_rmsnorm(x, x, weight, 1e-6)
        q_rot, k_rot = dispatch.rotary_embedding(positions, q, k, cos, sin)
        dispatch.write_kv_cache(k_rot, v, k_cache, v_cache, torch.tensor([4, 5, 6]))
        lens = torch.tensor([3], dtype=torch.int32)
        cu = torch.tensor([0, 3], dtype=torch.int32)
        prefill = dispatch.prefill_attention(q_rot, k_cache, v_cache, tables, lens, cu)
        decode = dispatch.decode_attention(q_rot[2:], k_cache, v_cache, tables, lens)
        gated = dispatch.silu_and_mul(torch.cat((normed, residual), dim=-1))
        return [normed, residual, q_rot, k_rot, k_cache, prefill, decode, gated]

    backend("torch")
    expected = layer()
    backend("triton")
    torch.testing.assert_close(layer(), expected)


def test_the_environment_sets_the_switch_and_an_unknown_value_fails_at_load(monkeypatch):
    try:
        monkeypatch.setenv(dispatch.ENV_VAR, "torch")
        importlib.reload(dispatch)
        assert dispatch.kernel_backend() == "torch"
        monkeypatch.setenv(dispatch.ENV_VAR, "cuda")
        with pytest.raises(ValueError, match="INFERGRID_KERNELS: 'cuda' is not one of auto"):
            importlib.reload(dispatch)
    finally:
        monkeypatch.undo()
        importlib.reload(dispatch)


def test_an_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="'gpu' is not one of auto, triton, torch"):
        dispatch.set_kernel_backend("gpu")
