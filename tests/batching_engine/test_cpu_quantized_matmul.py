"""The CPU quantized matmul (the C kernel behind int8/int4 weights on the CPU): it computes
x @ w.T for the weight its codes stand for, in each build the CPU runs, for every shape a
model has (rows of x from one decode token to a prefill chunk, widths that fill no whole strip).

A float build multiplies x as given: exact but for float rounding. A VNNI build first rounds
x to int8 per block of 32 (scale max|x| / 127), so each product is that of the weight and the
rounded x: off by at most half a step of each block times |w|, summed (`assert_product`). On
Gaussian data that is a relative error of about 5e-3: a block's largest |x| is about 2.2
sigma, its rounding error uniform in half a step, 2.2 / (127 * sqrt(12)) = 5e-3 of sigma."""

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

BUILDS = [name.lower() for name in cpu_build.TARGETS]
BLOCK = 32  # a VNNI build quantizes x per block of this many inputs


@pytest.fixture(params=BUILDS)
def build(request):
    """Each build the CPU can run (AVX-512 and AVX2, each with VNNI and without)."""
    with cpu_build.forced(request.param):
        if kernel.available() is not None:
            pytest.skip(f"this CPU cannot run it: {kernel.available()}")
        yield request.param


def half_steps(x: torch.Tensor) -> torch.Tensor:
    """Per element of x [m, k], half the step of the int8 grid its block of 32 is rounded to."""
    m, k = x.shape
    padded = torch.nn.functional.pad(x, (0, -k % BLOCK)).view(m, -1, BLOCK)
    steps = padded.abs().amax(dim=-1, keepdim=True) / 127 / 2
    return steps.expand_as(padded).reshape(m, -1)[:, :k]


def assert_product(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """`got` is x @ weight.T as the built kernel computes it (see the module's note)."""
    expected = x @ weight.T
    if not kernel.vnni():
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        return
    bound = half_steps(x) @ weight.abs().T + 1e-4 * (x.abs() @ weight.abs().T) + 1e-5
    excess = (got - expected).abs() - bound
    assert float(excess.max()) <= 0, f"off by {float(excess.max())} past the rounding bound"


shapes = st.tuples(
    st.integers(1, 40),  # rows of x: 1 (one decode), the direct int8 path, the buffered one
    st.integers(1, 70),  # output columns: strips of 16 or 32, the last one partial
    st.integers(1, 5),  # groups of 32 inputs
    st.integers(0, 2**31),
)


def _random(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _int8(n: int, k: int, seed: int) -> tuple[kernel.PackedWeight, torch.Tensor]:
    codes, scales = quantize_int8_rows(_random((n, k), seed))
    return kernel.pack_int8(codes, scales), codes.float() * scales[:, None]


def _int4(n: int, k: int, seed: int) -> tuple[kernel.PackedWeight, torch.Tensor]:
    codes, scales, low = quantize_int4_rows(_random((n, k), seed))
    return kernel.pack_int4(codes, scales, low), dequantize_int4_rows(codes, scales, low)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=shapes)
def test_int8_equals_the_dequantized_product(build, shape):
    m, n, groups, seed = shape
    k = groups * INT4_GROUP_SIZE - seed % 7  # int8 takes any width
    packed, weight = _int8(n, k, seed)
    x = _random((m, k), seed + 1)
    assert_product(kernel.matmul(x, packed), x, weight)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(shape=shapes)
def test_int4_equals_the_dequantized_product(build, shape):
    m, n, groups, seed = shape
    packed, weight = _int4(n, groups * INT4_GROUP_SIZE, seed)
    x = _random((m, groups * INT4_GROUP_SIZE), seed + 1)
    assert_product(kernel.matmul(x, packed), x, weight)


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("m", [1, 2, 5, 12, 13, 64, 100])
def test_every_row_count_stays_within_activation_rounding(build, mode, m):
    """Rows of x from one decode to a prefill chunk, across every row tile and its remainder;
    70 columns fill no whole strip; int8's 157 inputs no whole block."""
    k = 157 if mode == "int8" else 5 * INT4_GROUP_SIZE
    packed, weight = (_int8 if mode == "int8" else _int4)(70, k, m)
    x = _random((m, k), m + 1)
    got = kernel.matmul(x, packed)
    assert_product(got, x, weight)
    expected = x @ weight.T
    assert float((got - expected).norm() / expected.norm()) < 1e-2  # about 5e-3: module note


def test_a_block_of_zeros_and_a_block_of_extremes_round_without_overflow(build):
    """A zero block has no scale to divide by; a huge one must not wrap int8 or int32."""
    packed, weight = _int8(40, 96, 0)
    x = torch.zeros(2, 96)
    x[1, 32:64] = 3e4 * _random((32,), 1)
    assert_product(kernel.matmul(x, packed), x, weight)


def test_batched_inputs_keep_their_leading_dimensions(build):
    packed, weight = _int8(20, 64, 0)
    x = _random((2, 3, 64), 1)
    got = kernel.matmul(x, packed)
    assert got.shape == (2, 3, 20)
    assert_product(got.view(6, 20), x.view(6, 64), weight)


def test_a_mismatched_call_is_refused_before_the_kernel_reads(build):
    packed, _ = _int8(20, 64, 0)
    vnni = packed.vnni
    with pytest.raises(ValueError, match="x: 32 columns for a weight of 64"):
        kernel.matmul(_random((1, 32), 1), packed)
    with pytest.raises(ValueError, match="n=99 in"):
        kernel.PackedWeight(8, packed.codes, packed.scales, None, 99, 64, vnni)
    with pytest.raises(ValueError, match="codes"):
        kernel.PackedWeight(8, packed.codes, packed.scales, None, 20, 97, vnni)
    with pytest.raises(ValueError, match="lows belong to int4"):
        kernel.PackedWeight(4, packed.codes, packed.scales, None, 20, 64, vnni)


def test_a_weight_packed_for_another_build_is_refused(monkeypatch):
    """The VNNI and float builds of one width share a strip but not a layout."""
    vnni = cpu_build.target()
    if vnni not in cpu_build.FLOAT_TWIN:
        pytest.skip(f"no VNNI build on this CPU (auto builds {vnni})")
    try:
        packed, _ = _int8(20, 64, 0)
        monkeypatch.setenv(cpu_build.ENV_VAR, cpu_build.FLOAT_TWIN[vnni].lower())
        cpu_build.clear_cache()
        with pytest.raises(RuntimeError, match="pack them after choosing"):
            kernel.matmul(_random((1, 64), 1), packed)
    finally:
        cpu_build.clear_cache()


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_layers_use_the_kernel_and_compute_what_their_codes_stand_for(build, mode):
    weight, x = _random((50, 96), 0), _random((5, 96), 1)
    layer = QuantizedLinear(96, 50, mode, torch.float32)
    layer.load_rows(0, weight)
    stands_for = _dequantized(layer)
    layer.finish()
    assert layer.packed is not None
    assert_product(layer(x), x, stands_for)


def test_a_tied_embedding_looks_up_and_projects_from_its_packed_rows(build):
    table = QuantizedEmbedding(70, 64, torch.float32)
    table.load_rows(0, _random((70, 64), 0))
    rows = table.codes.float() * table.scales[:, None]
    table.finish()
    ids = torch.tensor([[0, 69], [33, 16]])
    torch.testing.assert_close(table(ids), rows[ids])
    hidden = _random((3, 64), 1)
    assert_product(table.as_head(hidden), hidden, rows)


def test_auto_takes_vnni_where_the_cpu_has_it(monkeypatch):
    monkeypatch.setenv(cpu_build.ENV_VAR, "auto")
    chosen = cpu_build.target()
    if chosen is None:
        pytest.skip("no AVX2 here: nothing is built")
    capability = torch.backends.cpu.get_cpu_capability()
    has_vnni = {"AVX512": "avx512_vnni", "AVX2": "avx_vnni"}[capability] in cpu_build.cpu_flags()
    assert chosen == (f"{capability}_VNNI" if has_vnni else capability)


def test_a_build_the_cpu_cannot_run_says_what_it_needs(monkeypatch):
    unrunnable = [name for name in cpu_build.TARGETS if not cpu_build.runs(name)]
    if not unrunnable:
        pytest.skip("this CPU runs every build")
    monkeypatch.setenv(cpu_build.ENV_VAR, unrunnable[0].lower())
    cpu_build.clear_cache()
    try:
        assert cpu_build.target() is None
        assert "needs" in kernel.available()
    finally:
        cpu_build.clear_cache()


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
