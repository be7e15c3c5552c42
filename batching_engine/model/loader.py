"""Load an HF-format Llama directory (config.json + one or many *.safetensors) into our modules.

The model is built on the meta device and materialised empty, so no time is spent on random
initialisation; every parameter must then be filled from the checkpoint, or loading fails and
names what is missing. Checkpoint names are HF's; q/k/v and gate/up tensors land in their
slice of the fused projections.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from batching_engine.model.config import LlamaConfig
from batching_engine.model.heads import LlamaForSequenceClassification
from batching_engine.model.llama import LlamaForCausalLM, LlamaModel
from batching_engine.model.rope import RotaryEmbedding
from infergrid.errors import ContractError

# Checkpoint tensors that hold nothing the model needs (older HF exports saved rope tables).
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def build_model(config: LlamaConfig) -> nn.Module:
    """The module for the config's architecture, with uninitialised weights."""
    if config.head == "lm_head":
        return LlamaForCausalLM(config)
    if config.head == "score":
        return LlamaForSequenceClassification(config)
    return LlamaModel(config)


def load_model(
    model_dir: str | Path, *, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[LlamaConfig, nn.Module]:
    """Read config and weights; returns the model in eval mode on `device` in `dtype`."""
    config = LlamaConfig.from_dir(model_dir)
    with torch.device("meta"):
        model = build_model(config).to(dtype=dtype)
    model = model.to_empty(device=torch.device(device))
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.reset_tables()
    load_weights(model, config, safetensors_files(model_dir))
    return config, model.eval().requires_grad_(False)


def safetensors_files(model_dir: str | Path) -> list[Path]:
    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ContractError("model_dir", f"no *.safetensors files in {model_dir}")
    return files


@torch.no_grad()
def load_weights(model: nn.Module, config: LlamaConfig, files: list[Path]) -> None:
    """Copy every checkpoint tensor into its (slice of a) parameter, then check all are filled."""
    params = dict(model.named_parameters())
    trunk_prefix = "" if isinstance(model, LlamaModel) else "model."
    rows_filled = dict.fromkeys(params, 0)
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as checkpoint:
            for name in checkpoint.keys():
                if _ignored(name, config):
                    continue
                field = f"{file.name}:{name}"
                target, offset = _target(name, config, trunk_prefix)
                if target not in params:
                    raise ContractError(field, "no such parameter in the model")
                tensor = checkpoint.get_tensor(name)
                _copy_rows(params[target], offset, tensor, field)
                rows_filled[target] += tensor.shape[0]
    missing = [name for name, param in params.items() if rows_filled[name] != param.shape[0]]
    if missing:
        raise ContractError("model_dir", f"checkpoint lacks weights for {', '.join(missing)}")


def _ignored(name: str, config: LlamaConfig) -> bool:
    """Rope tables of old exports, and a tied model's copy of its embedding as LM head."""
    tied_copy = config.tie_word_embeddings and name == "lm_head.weight"
    return tied_copy or name.endswith(_IGNORED_SUFFIXES)


def _target(name: str, config: LlamaConfig, trunk_prefix: str) -> tuple[str, int]:
    """Our parameter for an HF tensor name, and the row where the tensor starts in it."""
    if name.startswith(("lm_head.", "score.")):
        return name, 0
    trunk_name = trunk_prefix + name.removeprefix("model.")
    q_size = config.num_attention_heads * config.head_dim
    kv_size = config.num_key_value_heads * config.head_dim
    fused = {
        "self_attn.q_proj.weight": ("self_attn.qkv_proj.weight", 0),
        "self_attn.k_proj.weight": ("self_attn.qkv_proj.weight", q_size),
        "self_attn.v_proj.weight": ("self_attn.qkv_proj.weight", q_size + kv_size),
        "mlp.gate_proj.weight": ("mlp.gate_up_proj.weight", 0),
        "mlp.up_proj.weight": ("mlp.gate_up_proj.weight", config.intermediate_size),
    }
    for suffix, (fused_suffix, offset) in fused.items():
        if trunk_name.endswith(suffix):
            return trunk_name.removesuffix(suffix) + fused_suffix, offset
    return trunk_name, 0


def _copy_rows(param: nn.Parameter, offset: int, tensor: torch.Tensor, field: str) -> None:
    rows = param.data.narrow(0, offset, min(tensor.shape[0], param.shape[0] - offset))
    if rows.shape != tensor.shape:
        raise ContractError(field, f"shape {tuple(tensor.shape)} does not fit {tuple(rows.shape)}")
    rows.copy_(tensor.to(param.dtype))
