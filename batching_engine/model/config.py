"""The decoder settings the engine needs, read from an HF `config.json`.

Llama, Qwen2, Qwen3 and Mistral are one decoder with a few switches, so one config and one
model code serve them: `FAMILIES` says, per `model_type`, which architectures it names and
where its attention differs (biases on the q/k/v projections, a norm on each query and key
head). Only what the model code uses is kept, and everything is checked at load time: an
unknown architecture or rope type fails here with the field named, never later at request
time. Both rope spellings are read: transformers 5's `rope_parameters` (theta inside) and the
older `rope_theta` + `rope_scaling`. `model_config_from_dir` picks the family by config.json's
`model_type`: the decoders here, BERT encoders in `bert_config`.
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


@dataclass(frozen=True, slots=True)
class Family:
    """What one `model_type` changes in the shared decoder. `qkv_bias` and `o_bias` are True,
    False, or "attention_bias" (the config's own `attention_bias` decides)."""

    prefix: str  # of its architecture names: "Qwen2" -> Qwen2ForCausalLM
    qkv_bias: bool | str = "attention_bias"
    o_bias: bool | str = "attention_bias"
    qk_norm: bool = False  # an RMSNorm over each query and key head, before rotary

    def heads(self) -> dict[str, str]:
        """Each architecture of the family, and what it puts on top of the decoder."""
        return {
            f"{self.prefix}ForCausalLM": "lm_head",
            f"{self.prefix}ForSequenceClassification": "score",
            f"{self.prefix}Model": "none",
        }


FAMILIES = {
    "llama": Family("Llama"),
    "qwen2": Family("Qwen2", qkv_bias=True, o_bias=False),
    "qwen3": Family("Qwen3", qk_norm=True),
    "mistral": Family("Mistral", qkv_bias=False, o_bias=False),
}
# Every decoder architecture, and what it puts on top of the decoder.
ARCHITECTURE_HEADS = {name: head for f in FAMILIES.values() for name, head in f.heads().items()}


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
    """One decoder's shape, numerics, family switches and special token ids."""

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
    model_type: str = "llama"
    qkv_bias: bool = False
    o_bias: bool = False
    qk_norm: bool = False
    # The narrowest attention window of any layer (None: every layer sees its whole context).
    sliding_window: int | None = None

    @property
    def head(self) -> str:
        """ "lm_head", "score" or "none": the part on top of the decoder."""
        return ARCHITECTURE_HEADS[self.architecture]

    def context_limit(self) -> tuple[int, str]:
        """The longest context served exactly, and the field that sets it. The engine
        attends to a sequence's whole context in every layer, which is what a sliding-window
        layer computes too while the context fits in its window."""
        if self.sliding_window is not None and self.sliding_window < self.max_position_embeddings:
            return self.sliding_window, "sliding_window"
        return self.max_position_embeddings, "max_position_embeddings"

    @classmethod
    def from_dir(cls, model_dir: str | Path) -> LlamaConfig:
        return cls.from_dict(read_config_json(model_dir))

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> LlamaConfig:
        model_type, architecture = _architecture(raw)
        family = FAMILIES[model_type]
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
            model_type=model_type,
            qkv_bias=_switch(raw, family.qkv_bias),
            o_bias=_switch(raw, family.o_bias),
            qk_norm=family.qk_norm,
            sliding_window=_sliding_window(raw, model_type),
        )


ModelConfig = LlamaConfig | BertConfig

# config.json's model_type -> how its settings are read (an absent model_type is Llama's).
MODEL_TYPES = {
    **dict.fromkeys(FAMILIES, LlamaConfig.from_dict),
    "bert": BertConfig.from_dict,
}


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


def _architecture(raw: dict[str, Any]) -> tuple[str, str]:
    """The family's model_type and the one architecture config.json names, of that family."""
    model_type = raw.get("model_type", "llama")
    if model_type not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise ContractError("model_type", f"{model_type!r} is not a decoder; known: {known}")
    family = FAMILIES[model_type]
    return model_type, one_architecture(raw, f"{family.prefix}ForCausalLM", family.heads())


def _switch(raw: dict[str, Any], rule: bool | str) -> bool:
    """A family's fixed choice, or the config field that makes it."""
    if isinstance(rule, bool):
        return rule
    value = raw.get(rule) or False
    if not isinstance(value, bool):
        raise ContractError(rule, f"expected true or false, got {value!r}")
    return value


def _sliding_window(raw: dict[str, Any], model_type: str) -> int | None:
    """The narrowest window any layer attends through, or None. Mistral's window covers every
    layer; Qwen's only the layers `layer_types` marks sliding (older files: those from
    `max_window_layers` on, when `use_sliding_window`)."""
    window = raw.get("sliding_window")
    if window is None:
        return None
    if model_type == "mistral":
        return positive_int(raw, "sliding_window")
    layer_types = raw.get("layer_types")
    if layer_types is None:
        if not raw.get("use_sliding_window"):
            return None
        first = raw.get("max_window_layers", 0)
        layer_types = ["sliding_attention" if i >= first else "full_attention"
                       for i in range(positive_int(raw, "num_hidden_layers"))]  # fmt: skip
    if not isinstance(layer_types, list) or "sliding_attention" not in layer_types:
        return None
    return positive_int(raw, "sliding_window")


def _reject_unsupported(raw: dict[str, Any]) -> None:
    """Refuse variants the model code would otherwise compute silently wrong."""
    if raw.get("hidden_act", "silu") != "silu":
        raise ContractError("hidden_act", f"{raw['hidden_act']!r} is not supported; only 'silu'")
    if raw.get("mlp_bias"):
        raise ContractError("mlp_bias", "biases on the MLP are not supported")
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
    if ARCHITECTURE_HEADS[architecture] != "score":
        return 0
    return num_labels(raw)
