"""Quantized weights: what each mode keeps of a weight, what a quantized model computes, and
how much of the model's quality survives, measured as perplexity on a fixed text."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import BertConfig as HFBertConfig
from transformers import BertModel as HFBertModel

from batching_engine.kernels import cpu_build
from batching_engine.kernels import cpu_quantized_matmul as cpu_kernel
from batching_engine.model.gguf_import import import_gguf
from batching_engine.model.quantization import (
    GGUF_WEIGHT_TYPE_KEY,
    INT4_GROUP_SIZE,
    QuantizedLinear,
    dequantize_int4_rows,
    quantize_int4_rows,
    quantize_int8_rows,
    resolve_quantization,
)
from batching_engine.model.step_metadata import dense_metadata
from batching_engine.model_runner import ModelRunner
from batching_engine.tokenizer import Tokenizer
from harness.tiny_llama import hf_greedy, runner_greedy, save_tiny_llama
from infergrid.errors import ContractError
from tests.batching_engine.test_smollm2 import smollm2_gguf

TEXT = Path(__file__).parent / "data" / "perplexity.txt"
# The bounds: perplexity may rise by at most this share over the unquantized model.
PERPLEXITY_BOUNDS = {"int8": 0.02, "int4": 0.10}
CPU = torch.device("cpu")

weights = st.builds(
    lambda rows, groups, seed, spread: (
        torch.randn(rows, groups * INT4_GROUP_SIZE, generator=torch.Generator().manual_seed(seed))
        * spread
    ),
    st.integers(1, 8),
    st.integers(1, 4),
    st.integers(0, 2**31),
    st.floats(1e-3, 1e3),
)


@settings(max_examples=50, deadline=None)
@given(weights)
def test_int8_rows_are_within_half_a_step_of_the_weight(weight):
    codes, scales = quantize_int8_rows(weight)
    assert codes.dtype == torch.int8 and int(codes.abs().max()) <= 127
    error = (codes.float() * scales[:, None] - weight).abs()
    assert bool((error <= scales[:, None] * 0.5001).all())


@settings(max_examples=50, deadline=None)
@given(weights)
def test_int4_groups_are_within_half_a_step_of_the_weight(weight):
    codes, scales, low = quantize_int4_rows(weight)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 15
    error = (dequantize_int4_rows(codes, scales, low) - weight).abs()
    steps = scales.repeat_interleave(INT4_GROUP_SIZE, dim=1)
    assert bool((error <= steps * 0.5001 + 1e-6 * weight.abs()).all())


def test_q4_1_blocks_requantize_to_their_own_codes():
    """A Q4_1 block is `d * q + m` with q in 0..15; int4 groups are the same scheme, so a
    block that uses its whole range comes back as the very codes it was stored with."""
    generator = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (16, 4 * INT4_GROUP_SIZE), generator=generator)
    codes[:, ::INT4_GROUP_SIZE], codes[:, 1::INT4_GROUP_SIZE] = 0, 15  # every block's full range
    d = torch.rand(16, 4, generator=generator) * 0.1 + 0.01
    m = torch.randn(16, 4, generator=generator)
    weight = dequantize_int4_rows(codes.to(torch.uint8), d, m)
    again, _, _ = quantize_int4_rows(weight)
    assert torch.equal(again, codes.to(torch.uint8))


@pytest.fixture
def float_activations():
    """The kernel's float build: products exact to float rounding, so what is checked is the
    weights the codes stand for. The default VNNI build also rounds x to int8 per block;
    its bound is tests/batching_engine/test_cpu_quantized_matmul.py's, and the perplexity
    test below holds what that costs the model."""
    build = cpu_build.target()
    with cpu_build.forced(cpu_build.FLOAT_TWIN.get(build, build or "off").lower()):
        yield


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_a_quantized_linear_multiplies_by_the_weight_its_codes_stand_for(mode, float_activations):
    weight = torch.randn(96, 128, generator=torch.Generator().manual_seed(2))
    layer = QuantizedLinear(128, 96, mode, torch.float32)
    layer.load_rows(0, weight[:40])  # shard by shard, as the loader fills q, k and v
    layer.load_rows(40, weight[40:])
    if mode == "int8":
        stands_for = layer.codes.float() * layer.scales[:, None]
    else:
        stands_for = dequantize_int4_rows(layer.codes, layer.scales, layer.low)
    layer.finish()
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(layer(x), x @ stands_for.T, rtol=1e-4, atol=1e-4)


def test_int4_refuses_a_width_that_is_not_whole_groups():
    with pytest.raises(ContractError) as caught:
        QuantizedLinear(48, 16, "int4", torch.float32)
    assert caught.value.field == "quantization" and "32" in caught.value.reason


def stands_for(weight: torch.Tensor, mode: str) -> torch.Tensor:
    """The float weight that `mode`'s codes for `weight` stand for."""
    if mode == "int8":
        codes, scales = quantize_int8_rows(weight)
        return codes.float() * scales[:, None]
    return dequantize_int4_rows(*quantize_int4_rows(weight))


@torch.no_grad()
def with_weights_quantized(model, mode: str, tied: bool):
    """transformers' model holding what our quantized model holds: every projection as
    `mode` stands for it, the LM head too (int8 rows when it is the tied embedding)."""
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not (tied and name == "lm_head"):
            module.weight.copy_(stands_for(module.weight, mode))
    if tied:
        embedding = model.get_input_embeddings().weight
        embedding.copy_(stands_for(embedding, "int8"))
    return model


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_a_quantized_tiny_llama_decodes_as_transformers_with_the_same_weights(
    tmp_path, mode, tied, float_activations
):
    """Greedy tokens equal transformers' on the weights the codes stand for, and the
    weights (the head or tied embedding as int8 rows) take a fraction of float32's bytes."""
    reference = save_tiny_llama(
        tmp_path, hidden_size=128, intermediate_size=256, tie_word_embeddings=tied
    )
    plain = ModelRunner(tmp_path, kv_cache_memory_bytes=1 << 20, max_model_len=128)
    quantized = ModelRunner(
        tmp_path, kv_cache_memory_bytes=1 << 20, max_model_len=128, quantization=mode
    )
    assert quantized.weight_bytes < 0.45 * plain.weight_bytes
    reference = with_weights_quantized(reference, mode, tied)
    prompts = [[1, 5, 9, 200, 31], [7, 7, 100]]
    expected = [hf_greedy(reference, prompt, 12) for prompt in prompts]
    assert runner_greedy(quantized, prompts, 12) == expected


def test_quantization_applies_to_llama_models_only(tmp_path):
    config = HFBertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1,
                          num_attention_heads=2, intermediate_size=64)  # fmt: skip
    HFBertModel(config).save_pretrained(tmp_path)
    with pytest.raises(ContractError) as caught:
        ModelRunner(tmp_path, quantization="int8")
    assert caught.value.field == "quantization"


def _config_dir(tmp_path: Path, weight_type: str | None) -> Path:
    config = {} if weight_type is None else {GGUF_WEIGHT_TYPE_KEY: weight_type}
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize(
    ("weight_type", "device", "mode"),
    [
        ("Q4_1", "cuda", "int4"),
        ("Q4_0", "cuda", "int4"),
        ("Q8_0", "cuda", "int8"),
        ("Q4_K", "cuda", "int4"),
        ("Q5_0", "cuda", "int8"),
        ("Q5_K", "cuda", "int8"),
        ("Q6_K", "cuda", "int8"),
        ("F16", "cuda", "none"),
        (None, "cuda", "none"),
    ],
)
def test_auto_keeps_a_ggufs_quantized_weights_quantized_on_a_gpu(
    tmp_path, weight_type, device, mode
):
    model_dir = _config_dir(tmp_path, weight_type)
    resolved, why = resolve_quantization("auto", model_dir, torch.device(device))
    assert resolved == mode and why.startswith("auto")


@pytest.mark.parametrize(("switch", "mode"), [("auto", "int4"), ("off", "none")])
def test_on_the_cpu_auto_keeps_them_quantized_only_with_the_cpu_kernel(
    tmp_path, monkeypatch, switch, mode
):
    """Without the kernel, quantized matmuls on the CPU are slower than float32."""
    monkeypatch.setenv(cpu_build.ENV_VAR, switch)
    cpu_build.clear_cache()
    try:
        if switch == "auto" and cpu_kernel.available() is not None:
            pytest.skip(f"no CPU quantized kernel here: {cpu_kernel.available()}")
        resolved, why = resolve_quantization("auto", _config_dir(tmp_path, "Q4_1"), CPU)
        assert resolved == mode
        assert ("CPU kernel" in why) if mode == "int4" else ("no CPU quantized kernel" in why)
    finally:
        cpu_build.clear_cache()


@pytest.mark.parametrize("weight_type", ["Q2_K", "Q3_K", "IQ4_XS"])
def test_a_type_without_a_kernel_of_ours_is_dequantized_and_the_reason_says_so(
    tmp_path, weight_type
):
    resolved, why = resolve_quantization("auto", _config_dir(tmp_path, weight_type), CPU)
    assert resolved == "none"
    reason = f"{weight_type} weights dequantized to floats: the engine has no {weight_type} kernel"
    assert why == f"auto: {reason}"


def test_an_explicit_mode_is_taken_as_asked(tmp_path):
    model_dir = _config_dir(tmp_path, "Q4_1")
    assert resolve_quantization("int8", model_dir, torch.device("cpu"))[0] == "int8"
    assert resolve_quantization("none", model_dir, torch.device("cuda"))[0] == "none"


# SmolLM2: the shipped Q4_1 GGUF, the unquantized import against int8 and int4.


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    return import_gguf(smollm2_gguf(), tmp_path_factory.mktemp("gguf-cache"))


def perplexity(runner: ModelRunner, ids: list[int]) -> float:
    """exp(mean negative log-likelihood) of each next token of `ids`, in one pass."""
    tokens = torch.tensor(ids)
    with torch.inference_mode():
        hidden = runner.model(tokens, dense_metadata([len(ids)], runner.device))
        logits = runner.model.compute_logits(hidden).float()
    return math.exp(torch.nn.functional.cross_entropy(logits[:-1], tokens[1:]).item())


def test_the_import_records_the_files_weight_type(smollm2):
    assert json.loads((smollm2 / "config.json").read_text())[GGUF_WEIGHT_TYPE_KEY] == "Q4_1"


def test_smollm2_perplexity_rises_by_at_most_2_percent_for_int8_and_10_for_int4(smollm2):
    ids = Tokenizer(smollm2).encode(TEXT.read_text())
    assert len(ids) > 400
    runners = {
        mode: ModelRunner(
            smollm2, kv_cache_memory_bytes=64 << 20, max_model_len=1024, quantization=mode
        )
        for mode in ("none", "int8", "int4")
    }
    scores = {mode: perplexity(runner, ids) for mode, runner in runners.items()}
    base = scores["none"]
    for mode, score in scores.items():
        mib = runners[mode].weight_bytes / 2**20
        print(f"{mode}: perplexity {score:.3f} ({score / base - 1:+.2%}), weights {mib:.1f} MiB")
    for mode, bound in PERPLEXITY_BOUNDS.items():
        assert scores[mode] <= base * (1 + bound), mode


# The bound on the VNNI build's int8 activations: perplexity within this share of
# what the same weights give with float activations (its float twin).
ACTIVATION_BOUND = 0.01


@pytest.mark.parametrize("mode", ["int8", "int4"])
def test_int8_activations_keep_smollm2_perplexity_within_1_percent_of_float_ones(
    smollm2, monkeypatch, mode
):
    vnni = cpu_build.target()
    if vnni not in cpu_build.FLOAT_TWIN:
        pytest.skip(f"no VNNI build on this CPU (auto builds {vnni})")
    ids = Tokenizer(smollm2).encode(TEXT.read_text())
    scores = {}
    try:
        for build in (cpu_build.FLOAT_TWIN[vnni], vnni):
            monkeypatch.setenv(cpu_build.ENV_VAR, build.lower())
            cpu_build.clear_cache()  # the layers pack their weights for this build
            runner = ModelRunner(
                smollm2, kv_cache_memory_bytes=64 << 20, max_model_len=1024, quantization=mode
            )
            scores[build] = perplexity(runner, ids)
    finally:
        cpu_build.clear_cache()
    floats, integers = scores[cpu_build.FLOAT_TWIN[vnni]], scores[vnni]
    print(f"{mode}: perplexity {floats:.3f} float x, {integers:.3f} int8 x"
          f" ({integers / floats - 1:+.2%})")  # fmt: skip
    assert abs(integers / floats - 1) <= ACTIVATION_BOUND
