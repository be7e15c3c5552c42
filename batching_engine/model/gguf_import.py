"""Turn a llama or gemma3 GGUF file into an HF-format model directory, once per file.

The engine has one loader, for HF-format directories; a GGUF file is converted into one:
config.json, model.safetensors (float32, dequantized), tokenizer.json and tokenizer_config.json.
config.json records the type the blocks' matrices had in the file (`gguf_weight_type`), which
`--quantization auto` reads to hold them quantized again (model/quantization.py).
The result is cached under a directory named by the file's SHA-256, so the conversion runs the
first time a file is seen and never again; it is written to a temporary directory and renamed
into place, so a crash or a concurrent conversion never leaves a half-written model behind.

The llama.cpp conventions are undone on the way: a llama's Q and K rows are stored permuted
for its adjacent-pair rope (HF pairs dimension i with i + head_dim/2), Gemma's norm weights
hold the 1 its norm adds, and the tokenizer is stored as a raw vocabulary rather than a
tokenizer.json. Every tensor type the gguf package reads is dequantized, the K-quants
(Q4_K, Q5_K, Q6_K) included.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file

from batching_engine.model.derived_cache import derived_dir
from batching_engine.model.gguf_tokenizer import build_tokenizer, tokenizer_config
from batching_engine.model.quantization import GGUF_WEIGHT_TYPE_KEY
from infergrid.errors import ContractError

# GGUF tensor name (after "blk.N.") -> HF name (after "model.layers.N."), shared by both.
_LINEAR_TENSORS = {
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


@dataclass(frozen=True, slots=True)
class Layout:
    """How one GGUF architecture stores a decoder that HF names otherwise. llama.cpp
    interleaves a llama's Q and K rows for its adjacent-pair rope (`permuted_rope`), and
    stores Gemma's norm weights with the 1 that Gemma's norm adds already added (`norm_shift`)."""

    block_tensors: dict[str, str]
    permuted_rope: bool
    norm_shift: float


LAYOUTS = {
    "llama": Layout(
        {
            **_LINEAR_TENSORS,
            "attn_norm.weight": "input_layernorm.weight",
            "ffn_norm.weight": "post_attention_layernorm.weight",
        },
        permuted_rope=True,
        norm_shift=0.0,
    ),
    "gemma3": Layout(
        {
            **_LINEAR_TENSORS,
            "attn_norm.weight": "input_layernorm.weight",
            "post_attention_norm.weight": "post_attention_layernorm.weight",
            "ffn_norm.weight": "pre_feedforward_layernorm.weight",
            "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
            "attn_q_norm.weight": "self_attn.q_norm.weight",
            "attn_k_norm.weight": "self_attn.k_norm.weight",
        },
        permuted_rope=False,
        norm_shift=1.0,
    ),
}
# Gemma 3's sliding layers: all but every sixth, with a rope base of their own (llama.cpp's).
GEMMA3_SLIDING_PATTERN = 6
GEMMA3_LOCAL_ROPE_THETA = 10000.0
_TOP_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def import_gguf(gguf_path: str | Path, cache_root: str | Path | None = None) -> Path:
    """The HF-format directory for this GGUF file, converting it if it is not cached yet."""
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise ContractError("model.storageUri", f"GGUF file {gguf_path} does not exist")
    return derived_dir(gguf_path, lambda out: convert_gguf(gguf_path, out), cache_root)


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write config, weights and tokenizer files for `gguf_path` into `out_dir`."""
    reader = GGUFReader(gguf_path)
    metadata = read_metadata(reader)
    config = hf_config(metadata, {tensor.name for tensor in reader.tensors})
    config[GGUF_WEIGHT_TYPE_KEY] = weight_type(reader)
    layout = LAYOUTS[metadata["general.architecture"]]
    save_file(hf_weights(reader, config, layout), str(out_dir / "model.safetensors"))
    build_tokenizer(metadata, gguf_path).save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config(metadata))
    _write_json(out_dir / "config.json", config)


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """Every key-value field as a plain Python value (strings, numbers, lists)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def hf_config(metadata: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """config.json for a llama or gemma3 GGUF; anything the model code cannot honour fails
    here."""
    architecture = metadata.get("general.architecture")
    if architecture not in LAYOUTS:
        known = ", ".join(sorted(LAYOUTS))
        raise ContractError(
            "general.architecture", f"{architecture!r} is not supported; known: {known}"
        )
    if "rope_freqs.weight" in tensor_names:
        raise ContractError("rope_freqs.weight", "per-frequency rope factors are not supported")
    common = _decoder_config(metadata, architecture, tensor_names)
    if architecture == "gemma3":
        return {**common, **_gemma3_config(metadata, common)}
    return {
        **common,
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
    }


def _decoder_config(metadata: dict[str, Any], arch: str, tensor_names: set[str]) -> dict[str, Any]:
    """What every decoder's file says alike, under its architecture's key prefix."""
    hidden = _required(metadata, f"{arch}.embedding_length")
    heads = _required(metadata, f"{arch}.attention.head_count")
    head_dim = metadata.get(f"{arch}.attention.key_length", hidden // heads)
    if metadata.get(f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise ContractError(f"{arch}.rope.dimension_count", "partial rotary is not supported")
    tokens = _required(metadata, "tokenizer.ggml.tokens")
    return {
        "vocab_size": metadata.get(f"{arch}.vocab_size", len(tokens)),
        "hidden_size": hidden,
        "intermediate_size": _required(metadata, f"{arch}.feed_forward_length"),
        "num_hidden_layers": _required(metadata, f"{arch}.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": metadata.get(f"{arch}.attention.head_count_kv", heads),
        "head_dim": head_dim,
        "rms_norm_eps": float(_required(metadata, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(metadata.get(f"{arch}.rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(metadata, arch),
        "max_position_embeddings": _required(metadata, f"{arch}.context_length"),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": metadata.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": metadata.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }


def _gemma3_config(metadata: dict[str, Any], common: dict[str, Any]) -> dict[str, Any]:
    """Gemma 3's own fields, as llama.cpp reads the file: q·k scaled by the head size, the
    sliding window on all but every sixth layer, those layers rotating at base 10000."""
    layers = common["num_hidden_layers"]
    sliding = [(i + 1) % GEMMA3_SLIDING_PATTERN != 0 for i in range(layers)]
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "hidden_activation": "gelu_pytorch_tanh",
        "query_pre_attn_scalar": common["head_dim"],
        "sliding_window": _required(metadata, "gemma3.attention.sliding_window"),
        "layer_types": ["sliding_attention" if s else "full_attention" for s in sliding],
        "rope_local_base_freq": GEMMA3_LOCAL_ROPE_THETA,
    }


def weight_type(reader: GGUFReader) -> str:
    """The tensor type of most of the blocks' matrices (Q4_1, Q8_0, F16, ...): what `auto`
    quantization keeps them as."""
    types = Counter(
        tensor.tensor_type.name
        for tensor in reader.tensors
        if tensor.name.startswith("blk.") and len(tensor.shape) == 2
    )
    return types.most_common(1)[0][0] if types else "F32"


def _rope_scaling(metadata: dict[str, Any], arch: str) -> dict[str, Any] | None:
    kind = metadata.get(f"{arch}.rope.scaling.type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {
            "rope_type": "linear",
            "factor": float(_required(metadata, f"{arch}.rope.scaling.factor")),
        }
    raise ContractError(
        f"{arch}.rope.scaling.type", f"{kind!r} is not supported; known: none, linear"
    )


def hf_weights(
    reader: GGUFReader, config: dict[str, Any], layout: Layout
) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to float32 under its HF name, in HF's convention: Q and K
    rows un-permuted, norm weights shifted back."""
    weights = {}
    for tensor in reader.tensors:
        name = hf_tensor_name(tensor.name, layout)
        values = dequantize(tensor.data, tensor.tensor_type).reshape(tuple(reversed(tensor.shape)))
        if layout.permuted_rope and name.endswith("self_attn.q_proj.weight"):
            values = unpermute_rope_rows(values, config["num_attention_heads"])
        elif layout.permuted_rope and name.endswith("self_attn.k_proj.weight"):
            values = unpermute_rope_rows(values, config["num_key_value_heads"])
        elif layout.norm_shift and name.endswith("norm.weight"):
            values = values - layout.norm_shift
        values = np.ascontiguousarray(values, dtype=np.float32)
        weights[name] = torch.from_numpy(values if values.flags.writeable else values.copy())
    return weights


def hf_tensor_name(gguf_name: str, layout: Layout = LAYOUTS["llama"]) -> str:
    if gguf_name in _TOP_TENSORS:
        return _TOP_TENSORS[gguf_name]
    parts = gguf_name.split(".", 2)
    block = layout.block_tensors
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in block:
        return f"model.layers.{parts[1]}.{block[parts[2]]}"
    raise ContractError(f"tensors.{gguf_name}", "no HF counterpart")


def unpermute_rope_rows(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order.

    Within each head, llama.cpp interleaves the two rotated halves (rows 0, D/2, 1, D/2+1, ...)
    so its rope can rotate adjacent pairs; HF keeps the halves apart. Viewing each head's rows
    as [D/2, 2] and transposing to [2, D/2] restores HF's order.
    """
    rows, columns = weight.shape
    head_dim = rows // num_heads
    per_head = weight.reshape(num_heads, head_dim // 2, 2, columns)
    return per_head.swapaxes(1, 2).reshape(rows, columns)


def _required(metadata: dict[str, Any], key: str) -> Any:
    if key not in metadata:
        raise ContractError(key, "missing from the GGUF metadata")
    return metadata[key]


def _write_json(path: Path, document: dict[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2, ensure_ascii=False) + "\n")
