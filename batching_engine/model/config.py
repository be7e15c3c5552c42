"""The Llama-family settings the engine needs, read from an HF `config.json`.

Only what the model code uses is kept, and everything is checked at load time: an unknown
architecture or rope type fails here with the field named, never later at request time.
Both rope spellings are read: transformers 5's `rope_parameters` (theta inside) and the older
`rope_theta` + `rope_scaling`. `model_config_from_dir` picks the family by config.json's
`model_type`: Llama here, BERT encoders in `bert_config`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batching_engine.model.bert_config import BertConfig
from batching_engine.model.config_fields import (
    num_labels,
    one_architecture,
    positive_float,
    positive_int,
    token_ids,
)
from infergrid.errors import ContractError

# What each architecture puts on top of the decoder.
ARCHITECTURE_HEADS = {
    "LlamaForCausalLM": "lm_head",
    "LlamaForSequenceClassification": "score",
    "LlamaModel": "none",
}


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """How rope frequencies are stretched for long context; `kind` is "linear" or "llama3"."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """One Llama model's shape, numerics and special token ids."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: RopeScaling | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    num_labels: int = 0

    @property
    def head(self) -> str:
        """ "lm_head", "score" or "none": the part on top of the decoder."""
        return ARCHITECTURE_HEADS[self.architecture]

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> LlamaConfig:
        return cls.from_dict(read_config_json(model_dir))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LlamaConfig:
        architecture = _architecture(raw)
        _reject_unsupported(raw)
        hidden_size = positive_int(raw, "hidden_size")
        num_heads = positive_int(raw, "num_attention_heads")
        num_kv_heads = positive_int(raw, "num_key_value_heads", default=num_heads)
        if num_heads % num_kv_heads:
            raise ContractError(
                "num_key_value_heads",
                f"{num_kv_heads} does not divide num_attention_heads {num_heads}",
            )
        head_dim = raw.get("head_dim") or hidden_size // num_heads
        theta, scaling = _rope(raw)
        return cls(
            architecture=architecture,
            vocab_size=positive_int(raw, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=positive_int(raw, "intermediate_size"),
            num_hidden_layers=positive_int(raw, "num_hidden_layers"),
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=positive_int({"head_dim": head_dim}, "head_dim"),
            rms_norm_eps=positive_float(raw, "rms_norm_eps", default=1e-6),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=positive_int(raw, "max_position_embeddings", default=2048),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=token_ids(raw.get("eos_token_id"), "eos_token_id"),
            num_labels=_num_labels(raw, architecture),
        )


ModelConfig = LlamaConfig | BertConfig

# config.json's model_type -> how its settings are read (an absent model_type is Llama's).
MODEL_TYPES = {"llama": LlamaConfig.from_dict, "bert": BertConfig.from_dict}


def model_config_from_dir(model_dir: str | Path) -> ModelConfig:
    """The config of whichever supported family the directory's config.json names."""
    raw = read_config_json(model_dir)
    model_type = raw.get("model_type", "llama")
    if model_type not in MODEL_TYPES:
        known = ", ".join(sorted(MODEL_TYPES))
        raise ContractError("model_type", f"{model_type!r} is not supported; known: {known}")
    return MODEL_TYPES[model_type](raw)


def read_config_json(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / "config.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ContractError("model_dir", f"{path} does not exist") from None
    except json.JSONDecodeError as error:
        raise ContractError("config.json", f"not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise ContractError("config.json", "must be a JSON object")
    return raw


def _architecture(raw: dict[str, Any]) -> str:
    model_type = raw.get("model_type", "llama")
    if model_type != "llama":
        raise ContractError("model_type", f"{model_type!r} is not supported; only 'llama' is")
    return one_architecture(raw, "LlamaForCausalLM", ARCHITECTURE_HEADS)


def _reject_unsupported(raw: dict[str, Any]) -> None:
    """Refuse variants the model code would otherwise compute silently wrong."""
    if raw.get("hidden_act", "silu") != "silu":
        raise ContractError("hidden_act", f"{raw['hidden_act']!r} is not supported; only 'silu'")
    for flag in ("attention_bias", "mlp_bias"):
        if raw.get(flag):
            raise ContractError(flag, "biases are not supported")
    if raw.get("pretraining_tp", 1) != 1:
        raise ContractError("pretraining_tp", "only 1 is supported")


def _rope(raw: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    """Read rope theta and scaling from either spelling; "default" means no scaling."""
    if raw.get("rope_parameters") is not None:
        field, params = "rope_parameters", dict(raw["rope_parameters"])
    else:
        field, params = "rope_scaling", dict(raw.get("rope_scaling") or {})
    if "rope_theta" in params:
        theta = positive_float(params, "rope_theta", prefix=field)
    else:
        theta = positive_float(raw, "rope_theta", default=10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return theta, None
    factor = positive_float(params, "factor", prefix=field)
    if kind == "linear":
        return theta, RopeScaling(kind="linear", factor=factor)
    if kind == "llama3":
        low = positive_float(params, "low_freq_factor", prefix=field)
        high = positive_float(params, "high_freq_factor", prefix=field)
        if high <= low:
            raise ContractError(f"{field}.high_freq_factor", "must exceed low_freq_factor")
        original = positive_int(params, "original_max_position_embeddings", prefix=field)
        return theta, RopeScaling("llama3", factor, low, high, original)
    raise ContractError(
        f"{field}.rope_type", f"{kind!r} is not supported; known: default, linear, llama3"
    )


def _num_labels(raw: dict[str, Any], architecture: str) -> int:
    if architecture != "LlamaForSequenceClassification":
        return 0
    return num_labels(raw)
