"""The CPU quantized matmul (the C kernel behind int8/int4 weights on the CPU): it computes
x @ w.T for the weight its codes stand for, in both of its builds, for every shape a model
has (rows of x from one decode token to a prefill chunk, widths that fill no whole strip)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching_engine.kernels import cpu_build
from batching_engine.kernels import cpu_quantized_matmul as kernel
from batching_engine.model.quantization import (
    INT4_GROUP_SIZE,
    QuantizedEmbedding,
    QuantizedLinear,
    dequantize_int4_rows,
    quantize_int4_rows,
    quantize_int8_rows,
)

BUILDS = ["auto", "avx2"]


@pytest.fixture(params=BUILDS)
def build(request, monkeypatch):
    """Each build the CPU can run: its own instruction set, and AVX2 on an AVX-512 CPU."""
    monkeypatch.setenv(cpu_build.ENV_VAR, request.param)
    cpu_build.clear_cache()
    if kernel.available() is not None:
        pytest.skip(f"no CPU quantized kernel here: {kernel.available()}")
    yield request.param
    cpu_build.clear_cache()


shapes = st.tuples(
    st.integers(1, 40),  # rows of x: 1 (one decode), the direct int8 path, the buffered one
    st.integers(1, 70),  # output columns: strips of 16 or 32, the last one partial
    st.integers(1, 5),  # groups of 32 inputs
    st.integers(0, 2**31),
)


def _random(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=shapes)
def test_int8_equals_the_dequantized_product(build, shape):
    m, n, groups, seed = shape
    k = groups * INT4_GROUP_SIZE - seed % 7  # int8 takes any width
    weight, x = _random((n, k), seed), _random((m, k), seed + 1)
    codes, scales = quantize_int8_rows(weight)
    expected = x @ (codes.float() * scales[:, None]).T
    got = kernel.matmul(x, kernel.pack_int8(codes, scales))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=shapes)
def test_int4_equals_the_dequantized_product(build, shape):
    m, n, groups, seed = shape
    k = groups * INT4_GROUP_SIZE
    weight, x = _random((n, k), seed), _random((m, k), seed + 1)
    codes, scales, low = quantize_int4_rows(weight)
    expected = x @ dequantize_int4_rows(codes, scales, low).T
    got = kernel.matmul(x, kernel.pack_int4(codes, scales, low))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_batched_inputs_keep_their_leading_dimensions(build):
    codes, scales = quantize_int8_rows(_random((20, 64), 0))
    x = _random((2, 3, 64), 1)
    got = kernel.matmul(x, kernel.pack_int8(codes, scales))
    assert got.shape == (2, 3, 20)
    torch.testing.assert_close(got, x @ (codes.float() * scales[:, None]).T, rtol=1e-4, atol=1e-4)


def test_a_mismatched_call_is_refused_before_the_kernel_reads(build):
    codes, scales = quantize_int8_rows(_random((20, 64), 0))
    packed = kernel.pack_int8(codes, scales)
    with pytest.raises(ValueError, match="x: 32 columns for a weight of 64"):
        kernel.matmul(_random((1, 32), 1), packed)
    with pytest.raises(ValueError, match="n=99 in"):
        kernel.PackedWeight(8, packed.codes, packed.scales, None, 99, 64)
    with pytest.raises(ValueError, match="codes"):
        kernel.PackedWeight(8, packed.codes, packed.scales, None, 20, 65)
    with pytest.raises(ValueError, match="lows belong to int4"):
        kernel.PackedWeight(4, packed.codes, packed.scales, None, 20, 64)


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_layers_use_the_kernel_and_compute_what_their_codes_stand_for(build, mode):
    weight, x = _random((50, 96), 0), _random((5, 96), 1)
    layer = QuantizedLinear(96, 50, mode, torch.float32)
    layer.load_rows(0, weight)
    reference = x @ _dequantized(layer).T
    layer.finish()
    assert layer.packed is not None
    torch.testing.assert_close(layer(x), reference, rtol=1e-4, atol=1e-4)


def test_a_tied_embedding_looks_up_and_projects_from_its_packed_rows(build):
    table = QuantizedEmbedding(70, 64, torch.float32)
    table.load_rows(0, _random((70, 64), 0))
    rows = table.codes.float() * table.scales[:, None]
    table.finish()
    ids = torch.tensor([[0, 69], [33, 16]])
    torch.testing.assert_close(table(ids), rows[ids])
    hidden = _random((3, 64), 1)
    torch.testing.assert_close(table.as_head(hidden), hidden @ rows.T, rtol=1e-4, atol=1e-4)


def test_switched_off_the_layers_keep_the_dequantizing_path(monkeypatch):
    monkeypatch.setenv(cpu_build.ENV_VAR, "off")
    cpu_build.clear_cache()
    try:
        assert kernel.available() == f"{cpu_build.ENV_VAR}=off"
        layer = QuantizedLinear(64, 20, "int8", torch.float32)
        layer.load_rows(0, _random((20, 64), 0))
        reference = _random((2, 64), 1) @ _dequantized(layer).T
        layer.finish()
        assert layer.packed is None
        torch.testing.assert_close(layer(_random((2, 64), 1)), reference, rtol=1e-4, atol=1e-4)
    finally:
        cpu_build.clear_cache()


def test_an_unknown_switch_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(cpu_build.ENV_VAR, "fast")
    with pytest.raises(ValueError, match=cpu_build.ENV_VAR):
        cpu_build.target()


def test_a_failed_build_says_why(monkeypatch, tmp_path):
    monkeypatch.setenv("INFERGRID_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    cpu_build.clear_cache()
    try:
        reason = kernel.available()
        if cpu_build.target() is None:
            pytest.skip("no AVX2 here: nothing is built")
        assert reason is not None and reason.startswith("false ") and "failed" in reason
    finally:
        cpu_build.clear_cache()


def _dequantized(layer: QuantizedLinear) -> torch.Tensor:
    if layer.mode == "int8":
        return layer.codes.float() * layer.scales[:, None]
    return dequantize_int4_rows(layer.codes, layer.scales, layer.low)
