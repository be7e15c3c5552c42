"""Load an HF-format directory (config.json + one or many *.safetensors) into our modules: a
Llama decoder or a BERT encoder, as config.json's model_type says.

The model is built on the meta device and materialised empty, so no time is spent on random
initialisation; every parameter must then be filled from the checkpoint, or loading fails and
names what is missing. Checkpoint names are HF's; q/k/v and gate/up tensors land in their
slice of the fused projections, biases too (Qwen2's q/k/v).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import torch
from safetensors import safe_open
from torch import nn

from batching_engine.model.bert import BertForSequenceClassification, BertModel
from batching_engine.model.bert_config import BertConfig
from batching_engine.model.config import LlamaConfig, ModelConfig, model_config_from_dir
from batching_engine.model.heads import LlamaForSequenceClassification
from batching_engine.model.layers import RMSNorm
from batching_engine.model.llama import LlamaForCausalLM, LlamaModel
from batching_engine.model.quantization import RowQuantized, quantize_modules
from batching_engine.model.rope import RotaryEmbedding
from batching_engine.model.tensor_parallel import (
    SINGLE,
    TensorParallel,
    kv_heads,
    mlp_columns,
    query_heads,
    rows_of,
)
from infergrid.errors import ContractError

# Checkpoint tensors that hold two or three of HF Llama's in one (Phi-3's).
_FUSED_SUFFIXES = ("self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight")
# Checkpoint tensors that hold nothing the model needs (older HF exports saved rope tables).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# BERT checkpoint tensors the encoder never reads: index buffers and pretraining heads.
_BERT_IGNORED = ("embeddings.position_ids", "embeddings.token_type_ids", "cls.")
# HF BERT name parts -> ours, replaced in this order (attention's before the MLP's "output.").
_BERT_RENAMES = (
    ("LayerNorm.gamma", "LayerNorm.weight"),  # TF-era exports
    ("LayerNorm.beta", "LayerNorm.bias"),
    ("encoder.layer.", "layers."),
    ("attention.output.LayerNorm.", "attention_norm."),
    ("attention.output.dense.", "attention.o_proj."),
    ("intermediate.dense.", "mlp.up_proj."),
    ("output.LayerNorm.", "mlp_norm."),
    ("output.dense.", "mlp.down_proj."),
    ("embeddings.LayerNorm.", "embeddings.norm."),
)
_BERT_QKV = ("attention.self.query.", "attention.self.key.", "attention.self.value.")


class Placement(NamedTuple):
    """Where a checkpoint tensor goes: our parameter, the row its slice starts at, and the
    slice of the tensor this rank holds (rows, then columns; None: all)."""

    target: str
    offset: int = 0
    rows: slice | None = None
    columns: slice | None = None

    def part(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.rows is not None:
            tensor = tensor[self.rows]
        if self.columns is not None:
            tensor = tensor[:, self.columns]
        return tensor


def build_model(config: ModelConfig, tp: TensorParallel = SINGLE) -> nn.Module:
    """The module for the config's architecture, with uninitialised weights; this rank's
    share of it under tensor parallelism (a causal LM's only)."""
    if isinstance(config, BertConfig):
        if config.head == "classifier":
            return BertForSequenceClassification(config)
        return BertModel(config)
    if config.head == "lm_head":
        return LlamaForCausalLM(config, tp)
    if config.head == "score":
        return LlamaForSequenceClassification(config)
    return LlamaModel(config)


def load_model(
    model_dir: str | Path,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    quantization: str = "none",
    tp: TensorParallel = SINGLE,
) -> tuple[ModelConfig, nn.Module]:
    """Read config and weights; returns the model in eval mode on `device` in `dtype`, its
    linear layers held as `quantization` says ("none", "int8" or "int4"), this rank's share
    of them under tensor parallelism."""
    config = model_config_from_dir(model_dir)
    if tp.size > 1 and config.head != "lm_head":
        raise ContractError("tensor_parallel_size", "applies to text-generation models only")
    with torch.device("meta"):
        model = build_model(config, tp).to(dtype=dtype)
        if quantization != "none":
            if isinstance(config, BertConfig):
                raise ContractError("quantization", "applies to Llama models only")
            quantize_modules(model, quantization, dtype)
    model = model.to_empty(device=torch.device(device))
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.reset_tables()
    load_weights(model, config, safetensors_files(model_dir), tp)
    for module in model.modules():
        if isinstance(module, RowQuantized | RMSNorm):
            module.finish()
    return config, model.eval().requires_grad_(False)


def safetensors_files(model_dir: str | Path) -> list[Path]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ContractError("model_dir", f"no *.safetensors files in {model_dir}")
    return files


@torch.no_grad()
def load_weights(
    model: nn.Module, config: ModelConfig, files: list[Path], tp: TensorParallel = SINGLE
) -> None:
    """Copy every checkpoint tensor into its (slice of a) parameter, or quantize it into a
    quantized module's rows, then check all are filled."""
    params: dict[str, nn.Parameter | RowQuantized] = dict(model.named_parameters())
    params.update(
        (f"{name}.weight", module)
        for name, module in model.named_modules()
        if isinstance(module, RowQuantized)
    )
    trunk_prefix = "" if isinstance(model, LlamaModel | BertModel) else "model."
    rows_filled = dict.fromkeys(params, 0)
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as checkpoint:
            for stored in checkpoint.keys():
                for name, whole in _unfused(stored, checkpoint.get_tensor, config):
                    placement = _locate(name, config, trunk_prefix, tp)
                    if placement is None:
                        continue
                    field = f"{file.name}:{stored}"
                    target = placement.target
                    if target not in params:
                        raise ContractError(field, "no such parameter in the model")
                    tensor = placement.part(whole())
                    _copy_rows(params[target], placement.offset, tensor, field)
                    rows_filled[target] += tensor.shape[0]
    missing = [name for name, param in params.items() if rows_filled[name] != _rows(param)]
    if missing:
        raise ContractError("model_dir", f"checkpoint lacks weights for {', '.join(missing)}")


def _unfused(
    name: str, read: Callable[[str], torch.Tensor], config: ModelConfig
) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
    """The checkpoint tensor `name` as the unfused tensors HF's Llama names: Phi-3 stores q,
    k and v as one `qkv_proj`, and gate and up as one `gate_up_proj` (gate rows first), which
    each rank then cuts by head or column as it would the separate ones. The tensor is read
    only when a part is placed, and once for all its parts."""
    whole = functools.cache(lambda: read(name))
    if not isinstance(config, LlamaConfig) or not name.endswith(_FUSED_SUFFIXES):
        yield name, whole
        return
    q, kv = (
        config.num_attention_heads * config.head_dim,
        config.num_key_value_heads * config.head_dim,
    )
    if name.endswith("self_attn.qkv_proj.weight"):
        base = name.removesuffix("qkv_proj.weight")
        parts = (("q_proj", 0, q), ("k_proj", q, q + kv), ("v_proj", q + kv, q + 2 * kv))
    else:
        base, half = name.removesuffix("gate_up_proj.weight"), config.intermediate_size
        parts = (("gate_proj", 0, half), ("up_proj", half, 2 * half))
    for part, start, stop in parts:
        yield f"{base}{part}.weight", lambda start=start, stop=stop: whole()[start:stop]


def _locate(
    name: str, config: ModelConfig, trunk_prefix: str, tp: TensorParallel
) -> Placement | None:
    """Where a checkpoint tensor goes, or None to skip it."""
    if isinstance(config, BertConfig):
        found = _bert_target(name, config, trunk_prefix)
        return None if found is None else Placement(*found)
    if _ignored(name, config) or _held_by_rank_0(name, tp):
        return None
    return _target(name, config, trunk_prefix, tp)


def _bert_target(name: str, config: BertConfig, trunk_prefix: str) -> tuple[str, int] | None:
    """Ours for an HF BERT name, with or without the `bert.` prefix that task models add; the
    pooler only where a classifier reads it."""
    name = name.removeprefix("bert.")
    if name.startswith(_BERT_IGNORED):
        return None
    if name.startswith("pooler.dense."):
        classifies = config.head == "classifier"
        return ("pooler." + name.removeprefix("pooler.dense."), 0) if classifies else None
    if name.startswith("classifier."):
        return name, 0
    for old, new in _BERT_RENAMES:
        name = name.replace(old, new)
    for shard, part in enumerate(_BERT_QKV):
        if part in name:
            fused = name.replace(part, "attention.qkv_proj.")
            return trunk_prefix + fused, shard * config.hidden_size
    return trunk_prefix + name, 0


def _ignored(name: str, config: LlamaConfig) -> bool:
    """Rope tables of old exports, and a tied model's copy of its embedding as LM head."""
    tied_copy = config.tie_word_embeddings and name == "lm_head.weight"
    return tied_copy or name.endswith(_IGNORED_SUFFIXES)


def _held_by_rank_0(name: str, tp: TensorParallel) -> bool:
    """`o_proj`'s bias on the other ranks: each rank's partial output is summed, so the bias
    is added by rank 0 alone."""
    return tp.rank != 0 and name.endswith("self_attn.o_proj.bias")


def _target(name: str, config: LlamaConfig, trunk_prefix: str, tp: TensorParallel) -> Placement:
    """Our parameter for an HF tensor name, the row where the tensor starts in it, and this
    rank's slice of it (see model/tensor_parallel.py for the split)."""
    if name.startswith(("lm_head.", "score.")):
        return Placement(name)
    trunk_name = trunk_prefix + name.removeprefix("model.")
    head_dim = config.head_dim
    q = rows_of(query_heads(config.num_attention_heads, config.num_key_value_heads, tp), head_dim)
    kv = rows_of(kv_heads(config.num_key_value_heads, tp), head_dim)
    mlp = mlp_columns(config.intermediate_size, tp)
    mlp_rows = slice(mlp.start, mlp.stop)
    q_size, kv_size = q.stop - q.start, kv.stop - kv.start
    split = {
        "self_attn.q_proj.weight": ("self_attn.qkv_proj.weight", 0, q, None),
        "self_attn.k_proj.weight": ("self_attn.qkv_proj.weight", q_size, kv, None),
        "self_attn.v_proj.weight": ("self_attn.qkv_proj.weight", q_size + kv_size, kv, None),
        "self_attn.q_proj.bias": ("self_attn.qkv_proj.bias", 0, q, None),
        "self_attn.k_proj.bias": ("self_attn.qkv_proj.bias", q_size, kv, None),
        "self_attn.v_proj.bias": ("self_attn.qkv_proj.bias", q_size + kv_size, kv, None),
        "self_attn.o_proj.weight": ("self_attn.o_proj.weight", 0, None, q),
        # A dense MLP's (`mlp.`) or an expert's (`mlp.experts.<e>.`).
        ".gate_proj.weight": (".gate_up_proj.weight", 0, mlp_rows, None),
        ".up_proj.weight": (".gate_up_proj.weight", len(mlp), mlp_rows, None),
        ".down_proj.weight": (".down_proj.weight", 0, None, mlp_rows),
    }
    trunk_name = _expert_name(trunk_name)
    for suffix, (ours, offset, rows, columns) in split.items():
        if trunk_name.endswith(suffix):
            return Placement(trunk_name.removesuffix(suffix) + ours, offset, rows, columns)
    return Placement(trunk_name)


def _expert_name(name: str) -> str:
    """Mixtral's names as a dense MLP's: `block_sparse_moe.experts.<e>.w1` (gate), `w3` (up)
    and `w2` (down) inside our `mlp.experts.<e>`, the router as `mlp.gate`; the split then
    places each expert's rows and columns as it does a dense MLP's."""
    if ".block_sparse_moe." not in name:
        return name
    name = name.replace(".block_sparse_moe.", ".mlp.")
    for old, new in (("w1.weight", "gate_proj.weight"), ("w3.weight", "up_proj.weight"),
                     ("w2.weight", "down_proj.weight")):  # fmt: skip
        if name.endswith(f".{old}"):
            return name.removesuffix(old) + new
    return name


def _rows(target: nn.Parameter | RowQuantized) -> int:
    return target.rows if isinstance(target, RowQuantized) else target.shape[0]


def _copy_rows(
    target: nn.Parameter | RowQuantized, offset: int, tensor: torch.Tensor, field: str
) -> None:
    if isinstance(target, RowQuantized):
        expected = (min(tensor.shape[0], target.rows - offset), target.columns)
        if tuple(tensor.shape) != expected:
            raise ContractError(field, f"shape {tuple(tensor.shape)} does not fit {expected}")
        target.load_rows(offset, tensor)
        return
    param = target
    rows = param.data.narrow(0, offset, min(tensor.shape[0], param.shape[0] - offset))
    if rows.shape != tensor.shape:
        raise ContractError(field, f"shape {tuple(tensor.shape)} does not fit {tuple(rows.shape)}")
    rows.copy_(tensor.to(param.dtype))
