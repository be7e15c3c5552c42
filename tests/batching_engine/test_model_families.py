"""Qwen2, Qwen3, Mistral, Phi-3, Gemma 2 and Gemma 3 decode exactly what transformers decodes,
through the paged KV cache and continuous batching, quirks included: Qwen2's q/k/v biases,
Qwen3's norm on each query and key head, Llama's optional attention biases, Phi-3's fused
projections, sliding windows narrower than the contexts, Gemma's norms around each sublayer
(scaling by 1 + weight), scaled embedding, GELU gate and attention scale, Gemma 3's rope base
per layer kind, and Gemma 2's soft-capped attention scores and logits.

Each model is tiny, random and made on the spot by transformers (`harness/tiny_llama.py`),
with every bias and norm weight drawn, so that a bias or norm left out changes the tokens.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from batching_engine.config import EngineConfig
from batching_engine.engine import LLMEngine
from batching_engine.model.attention import DenseAttentionMetadata
from batching_engine.model.config import SOFTCAPS, LlamaConfig, model_config_from_dir
from batching_engine.model.layers import Linear
from batching_engine.model.loader import load_model
from batching_engine.model.quantization import QuantizedLinear
from batching_engine.model_runner import ModelRunner
from batching_engine.sequence import SamplingParams, Sequence
from harness.tiny_llama import hf_greedy, runner_greedy, save_tiny_decoder
from infergrid.errors import ContractError

# Gemma 3's own: an attention scale other than head_dim's, sliding and full layers, each
# kind with its rope base (the window wider than any test's context unless a variant says).
GEMMA3 = {
    "query_pre_attn_scalar": 24,
    "layer_types": ["sliding_attention", "full_attention"],
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    },
}
# Gemma 2's own: caps small enough to change random weights' scores and logits, and
# transformers' default layers (every other one sliding, through a window wider than any test's
# context unless a variant says).
GEMMA2 = {
    "query_pre_attn_scalar": 24,
    "attn_logit_softcapping": 5.0,
    "final_logit_softcapping": 3.0,
}
# family -> overrides of the tiny model that bring out its quirks
FAMILIES = {
    "qwen2": {},
    "qwen3": {"attention_bias": True},
    "qwen3-tied": {"tie_word_embeddings": True},
    "mistral": {"sliding_window": 4096},
    # Windows far narrower than the contexts: every prompt and most decodes slide.
    "mistral-window-8": {"sliding_window": 8},
    "qwen2-sliding-layer": {
        "sliding_window": 5,
        "use_sliding_window": True,
        "layer_types": ["full_attention", "sliding_attention"],
    },
    "llama-attention-bias": {"attention_bias": True},
    "phi3": {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
    "phi3-window-7": {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "sliding_window": 7},
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "mixtral-top-1-of-8": {"num_local_experts": 8, "num_experts_per_tok": 1},
    "gemma3_text": {"tie_word_embeddings": False, **GEMMA3},
    "gemma3_text-tied": {"initializer_range": 0.05, **GEMMA3},
    "gemma3_text-window-6": {"tie_word_embeddings": False, **GEMMA3, "sliding_window": 6},
    "gemma3_text-capped-logits": {
        "tie_word_embeddings": False,
        **GEMMA3,
        "final_logit_softcapping": GEMMA2["final_logit_softcapping"],
    },
    "gemma2": {"tie_word_embeddings": False, **GEMMA2},
    "gemma2-window-6": {"tie_word_embeddings": False, **GEMMA2, "sliding_window": 6},
}


def family_of(variant: str) -> str:
    return variant.split("-")[0]


def prompts(*lengths: int, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(scope="module", params=FAMILIES)
def tiny(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return path, save_tiny_decoder(path, family_of(request.param), **FAMILIES[request.param])


def test_the_config_reads_each_familys_switches(tiny):
    path, reference = tiny
    config = model_config_from_dir(path)
    assert isinstance(config, LlamaConfig)
    assert config.model_type == reference.config.model_type
    attention = reference.model.layers[0].self_attn
    q_proj = getattr(attention, "q_proj", None) or attention.qkv_proj  # Phi-3 fuses them
    assert config.qkv_bias == (q_proj.bias is not None)
    assert config.o_bias == (attention.o_proj.bias is not None)
    assert config.qk_norm == hasattr(attention, "q_norm")
    for cap in SOFTCAPS:
        assert getattr(config, cap) == getattr(reference.config, cap, None)


def test_greedy_tokens_equal_transformers_with_chunked_prefill_in_one_batch(tiny):
    path, reference = tiny
    runner = ModelRunner(path, kv_cache_memory_bytes=1 << 20, max_model_len=128)
    batch = prompts(1, 9, 40, 23)
    expected = [hf_greedy(reference, prompt, 16) for prompt in batch]
    assert runner_greedy(runner, batch, 16, chunk_size=7) == expected


def test_continuous_batching_with_preemption_decodes_each_request_as_alone(tiny):
    path, reference = tiny
    lengths, max_tokens = [5, 31, 12, 44, 2, 19], [20, 9, 25, 14, 30, 11]
    batch = prompts(*lengths, seed=4)
    expected = [hf_greedy(reference, p, n) for p, n in zip(batch, max_tokens, strict=True)]
    config = EngineConfig(max_num_seqs=6, max_num_batched_tokens=24, max_model_len=64)
    # 6 blocks of 16 tokens hold the longest request (58 tokens) but not the six together:
    # some are preempted and recomputed on the way.
    runner = ModelRunner(
        path,
        block_size=config.block_size,
        kv_cache_memory_bytes=6 * runner_block_bytes(path, config.block_size),
        max_model_len=config.max_model_len,
    )
    engine = LLMEngine(config, runner, eos_token_ids=())
    seqs = [
        Sequence(p, SamplingParams(temperature=0.0, max_tokens=n), queue_timeout_s=math.inf)
        for p, n in zip(batch, max_tokens, strict=True)
    ]
    for seq in seqs:
        engine.add_request(seq)
    while engine.has_unfinished():
        engine.step()
    assert [seq.output_token_ids for seq in seqs] == expected
    assert sum(seq.num_preemptions for seq in seqs) > 0


def runner_block_bytes(path, block_size: int) -> int:
    """One block of K and V over every layer, in float32."""
    config = model_config_from_dir(path)
    per_token = 2 * config.num_key_value_heads * config.head_dim * 4
    return config.num_hidden_layers * block_size * per_token


def test_gemma3_files_older_than_layer_types_read_the_same(tmp_path):
    save_tiny_decoder(tmp_path, "gemma3_text", **GEMMA3)
    current = model_config_from_dir(tmp_path)
    edited_config(
        tmp_path, layer_types=None, rope_parameters=None, sliding_window_pattern=2,
        rope_theta=1000000.0, rope_local_base_freq=10000.0,
    )  # fmt: skip
    older = model_config_from_dir(tmp_path)
    assert older.sliding_layers == current.sliding_layers == (True, False)
    assert older.local_rope_theta == current.local_rope_theta == 10000.0
    assert older.rope_theta == current.rope_theta == 1000000.0


def test_gemma2_files_older_than_layer_types_slide_every_other_layer(tmp_path):
    save_tiny_decoder(tmp_path, "gemma2", num_hidden_layers=4, **GEMMA2)
    current = model_config_from_dir(tmp_path)
    edited_config(tmp_path, layer_types=None)
    older = model_config_from_dir(tmp_path)
    assert older.sliding_layers == current.sliding_layers == (True, False, True, False)
    assert older.local_rope_theta is None  # one rope base for every layer


@pytest.mark.parametrize("variant", ["gemma2", "gemma2-window-6", "gemma3_text-capped-logits"])
def test_soft_capped_logits_are_transformers(tmp_path, variant):
    """The final cap keeps the logits' order, so greedy tokens cannot show it: the logits do,
    here from one pass over the whole prompt (the single-pass models' attention)."""
    reference = save_tiny_decoder(tmp_path, family_of(variant), **FAMILIES[variant])
    _, model = load_model(tmp_path)
    ids = torch.tensor(prompts(30)[0])
    meta = DenseAttentionMetadata(positions=torch.arange(30), seq_lens_host=(30,))
    with torch.no_grad():
        logits = model.compute_logits(model(ids, meta))
        expected = reference(ids[None]).logits[0]
    assert expected.abs().max() < GEMMA2["final_logit_softcapping"]
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


def test_an_int8_embedding_keeps_gemmas_scale_on_lookups_not_as_the_head(tmp_path):
    save_tiny_decoder(tmp_path, "gemma3_text", **GEMMA3)
    plain = ModelRunner(tmp_path, kv_cache_memory_bytes=1 << 20, max_model_len=64)
    int8 = ModelRunner(
        tmp_path, kv_cache_memory_bytes=1 << 20, max_model_len=64, quantization="int8"
    )
    ids = torch.arange(0, 256, 7)
    expected = plain.model.model.embed_tokens(ids)
    torch.testing.assert_close(int8.model.model.embed_tokens(ids), expected, rtol=0, atol=0.05)
    hidden = torch.randn(3, 64)
    torch.testing.assert_close(
        int8.model.compute_logits(hidden), plain.model.compute_logits(hidden), rtol=0, atol=0.1
    )


def test_quantized_experts_keep_their_router_in_floats(tmp_path):
    save_tiny_decoder(tmp_path, "mixtral", num_local_experts=4, num_experts_per_tok=2)
    runner = ModelRunner(tmp_path, kv_cache_memory_bytes=1 << 20, max_model_len=64,
                         quantization="int8")  # fmt: skip
    moe = runner.model.model.layers[0].mlp
    assert type(moe.gate) is Linear
    assert type(moe.experts[3].down_proj) is QuantizedLinear
    tokens = runner_greedy(runner, prompts(9), 8)[0]
    assert len(tokens) == 8


def test_quantized_weights_keep_the_biases(tmp_path):
    save_tiny_decoder(tmp_path, "qwen2")
    plain = ModelRunner(tmp_path, kv_cache_memory_bytes=1 << 20, max_model_len=64)
    int8 = ModelRunner(
        tmp_path, kv_cache_memory_bytes=1 << 20, max_model_len=64, quantization="int8"
    )
    attention = int8.model.model.layers[0].self_attn
    assert attention.qkv_proj.bias is not None
    torch.testing.assert_close(
        attention.qkv_proj.bias, plain.model.model.layers[0].self_attn.qkv_proj.bias
    )


# The edits that make the tiny Qwen3 a Gemma 3, or a Gemma 2, as far as the config goes.
GEMMA_OF_QWEN3 = {
    "model_type": "gemma3_text",
    "architectures": ["Gemma3ForCausalLM"],
    "query_pre_attn_scalar": 16,
}
GEMMA2_OF_QWEN3 = {**GEMMA_OF_QWEN3, "model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]}


def edited_config(path, **changes) -> None:
    config_path = path / "config.json"
    raw = json.loads(config_path.read_text())
    raw.update(changes)
    config_path.write_text(json.dumps(raw))


def test_qwen_windows_count_only_where_its_layers_slide(tmp_path):
    save_tiny_decoder(tmp_path, "qwen2")
    edited_config(tmp_path, sliding_window=32, use_sliding_window=False,
                  layer_types=["full_attention", "full_attention"])  # fmt: skip
    assert model_config_from_dir(tmp_path).sliding_window is None
    edited_config(tmp_path, layer_types=["full_attention", "sliding_attention"])
    assert model_config_from_dir(tmp_path).sliding_window == 32
    edited_config(tmp_path, layer_types=None, use_sliding_window=True, max_window_layers=1)
    assert model_config_from_dir(tmp_path).sliding_window == 32


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"model_type": "gemma"}, "model_type"),
        ({"architectures": ["LlamaForCausalLM"]}, "architectures"),
        ({"attention_bias": "yes"}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        # Caps where transformers applies none, and caps that are no number above 0.
        ({"final_logit_softcapping": 30.0}, "final_logit_softcapping"),
        ({**GEMMA_OF_QWEN3, "attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
        ({**GEMMA2_OF_QWEN3, "attn_logit_softcapping": 0}, "attn_logit_softcapping"),
        ({**GEMMA2_OF_QWEN3, "final_logit_softcapping": -30.0}, "final_logit_softcapping"),
        ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        (
            {
                "model_type": "mixtral",
                "architectures": ["MixtralForCausalLM"],
                "num_local_experts": 2,
                "num_experts_per_tok": 3,
            },
            "num_experts_per_tok",
        ),
        (
            {"rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.75}},
            "partial_rotary_factor",
        ),
        ({"sliding_window": 8, "layer_types": ["full_attention"]}, "layer_types"),
        ({"sliding_window": 0, "layer_types": ["sliding_attention"] * 2}, "sliding_window"),
        ({"sliding_window": 8, "layer_types": ["chunked_attention"] * 2}, "layer_types"),
    ],
)
def test_a_config_the_model_code_would_misread_is_refused_naming_the_field(
    tmp_path, changes, field
):
    save_tiny_decoder(tmp_path, "qwen3")
    edited_config(tmp_path, **changes)
    with pytest.raises(ContractError, match=f"^{field}:"):
        model_config_from_dir(tmp_path)
