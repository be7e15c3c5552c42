"""Importing a llama GGUF: weights back in HF's layout, tokenizer rebuilt, converted once.

The GGUF is written in the test from a tiny HF model, laid out as llama.cpp's converter lays
it out (Q and K rows permuted per head, the embedding quantized to Q8_0), so the import is
checked against the weights the file was made from.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from safetensors.torch import load_file
from tokenizers import pre_tokenizers

from batching_engine.model.gguf_import import import_gguf
from batching_engine.tokenizer import Tokenizer
from harness.tiny_llama import TINY, save_tiny_llama
from infergrid.errors import ContractError

SPECIALS = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]
BYTES = sorted(pre_tokenizers.ByteLevel.alphabet())
VOCAB = BYTES + ["he", "hel", "hell", "hello"] + SPECIALS
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
)
HF_TO_GGUF = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def llama_cpp_rope_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter: each head's two rotated halves interleaved row by row."""
    rows, columns = weight.shape
    return (
        weight.reshape(heads, 2, rows // heads // 2, columns).swapaxes(1, 2).reshape(rows, columns)
    )


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{HF_TO_GGUF[rest.removesuffix('.weight')]}.weight"


def write_gguf(
    path: Path, weights: dict[str, torch.Tensor], *, arch: str = "llama", pre: str = "smollm"
) -> Path:
    writer = GGUFWriter(path, arch)
    writer.add_block_count(TINY["num_hidden_layers"])
    writer.add_context_length(TINY["max_position_embeddings"])
    writer.add_embedding_length(TINY["hidden_size"])
    writer.add_feed_forward_length(TINY["intermediate_size"])
    writer.add_head_count(TINY["num_attention_heads"])
    writer.add_head_count_kv(TINY["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(TINY["rms_norm_eps"])
    writer.add_rope_freq_base(10000.0)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(VOCAB)
    writer.add_token_types([1] * (len(VOCAB) - len(SPECIALS)) + [3] * len(SPECIALS))
    writer.add_token_merges(["h e", "he l", "hel l", "hell o"])
    writer.add_bos_token_id(VOCAB.index("<s>"))
    writer.add_eos_token_id(VOCAB.index("<|im_end|>"))
    writer.add_chat_template(TEMPLATE)
    for name, tensor in weights.items():
        values = tensor.numpy()
        if name.endswith("q_proj.weight"):
            values = llama_cpp_rope_permute(values, TINY["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            values = llama_cpp_rope_permute(values, TINY["num_key_value_heads"])
        if name == "model.embed_tokens.weight":
            writer.add_tensor(
                gguf_name(name),
                quantize(values, GGMLQuantizationType.Q8_0),
                raw_dtype=GGMLQuantizationType.Q8_0,
            )
        else:
            writer.add_tensor(gguf_name(name), np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> dict[str, torch.Tensor]:
    path = tmp_path_factory.mktemp("hf")
    save_tiny_llama(path, vocab_size=len(VOCAB), tie_word_embeddings=True)
    return load_file(path / "model.safetensors")


def test_weights_come_back_in_hf_layout(tmp_path, original):
    converted = import_gguf(write_gguf(tmp_path / "tiny.gguf", original), tmp_path / "cache")
    weights = load_file(converted / "model.safetensors")
    assert set(weights) == set(original)
    for name in original:
        if name == "model.embed_tokens.weight":  # Q8_0: within a step of its 8-bit grid
            torch.testing.assert_close(weights[name], original[name], atol=0.02, rtol=0.01)
        else:
            assert torch.equal(weights[name], original[name]), name


def test_the_config_describes_the_same_model(tmp_path, original):
    converted = import_gguf(write_gguf(tmp_path / "tiny.gguf", original), tmp_path / "cache")
    config = json.loads((converted / "config.json").read_text())
    assert config["num_key_value_heads"] == 2 and config["head_dim"] == 16
    assert config["tie_word_embeddings"] is True  # the file has no output.weight
    assert config["eos_token_id"] == VOCAB.index("<|im_end|>")


def test_the_tokenizer_keeps_the_vocabulary_merges_specials_and_template(tmp_path, original):
    converted = import_gguf(write_gguf(tmp_path / "tiny.gguf", original), tmp_path / "cache")
    tokenizer = Tokenizer(converted)
    assert tokenizer.encode("hello") == [VOCAB.index("hello")]
    assert tokenizer.encode("<|im_start|>") == [VOCAB.index("<|im_start|>")]
    assert tokenizer.decode(tokenizer.encode("hello wörld 42")) == "hello wörld 42"
    assert tokenizer.eos_token_ids == {VOCAB.index("<|im_end|>")}
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n"
    )


def test_a_file_is_converted_once_and_another_file_gets_its_own_directory(tmp_path, original):
    first = import_gguf(write_gguf(tmp_path / "a.gguf", original), tmp_path / "cache")
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert import_gguf(tmp_path / "a.gguf", tmp_path / "cache") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    changed = dict(original, **{"model.norm.weight": original["model.norm.weight"] * 2})
    second = import_gguf(write_gguf(tmp_path / "b.gguf", changed), tmp_path / "cache")
    assert second != first and second.parent == first.parent


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"arch": "falcon"}, "^general.architecture: 'falcon' is not supported"),
        ({"pre": "qwen2"}, "^tokenizer.ggml.pre: 'qwen2' is not supported"),
    ],
)
def test_files_the_engine_cannot_serve_are_refused_and_leave_nothing_cached(
    tmp_path, original, kwargs, message
):
    path = write_gguf(tmp_path / "bad.gguf", original, **kwargs)
    with pytest.raises(ContractError, match=message):
        import_gguf(path, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ContractError, match="^model.storageUri: GGUF file .* does not exist"):
        import_gguf(tmp_path / "absent.gguf", tmp_path / "cache")
