"""The decoder settings the engine needs, read from an HF `config.json`.

Llama, Qwen2, Qwen3, Mistral, Mixtral, Phi-3, Gemma 2 and Gemma 3 are one decoder with a few
switches, so one config and one model code serve them: `FAMILIES` says, per `model_type`, which
architectures it names and where it differs (biases on the q/k/v projections, a norm on each
query and key head, Gemma's norms, embedding, gate and soft-capping, Mixtral's experts). Only
what the model code uses is kept, and everything is checked at load time: an unknown
architecture or rope type fails here with the field named, never later at request time. Both
rope spellings are read: transformers 5's `rope_parameters` (theta inside) and the older
`rope_theta` + `rope_scaling`. `model_config_from_dir` picks the family by config.json's
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
    activation_key: str = "hidden_act"  # the config field naming the MLP's gate activation
    # Gemma: the attention and MLP outputs are normed too (four norms a layer), every norm
    # scales by 1 + weight, the embedding is scaled by sqrt(hidden_size), attention by
    # query_pre_attn_scalar.
    gemma: bool = False
    local_rope: bool = False  # Gemma 3: sliding layers rotate with a rope base of their own
    # The `SOFTCAPS` its transformers code applies when the config sets them.
    softcaps: tuple[str, ...] = ()
    moe: bool = False  # Mixtral: a router picks each token's experts (`num_local_experts`)
    # Its `sliding_window` covers every layer, with no `layer_types` to say which.
    window_on_every_layer: bool = False
    # Files older than `layer_types`: all but every nth layer slide (0: not said this way).
    sliding_window_pattern: int = 0
    architectures: tuple[str, ...] = ("ForCausalLM", "ForSequenceClassification", "Model")

    def heads(self) -> dict[str, str]:
        """Each architecture of the family, and what it puts on top of the decoder."""
        kinds = {"ForCausalLM": "lm_head", "ForSequenceClassification": "score"}
        return {f"{self.prefix}{a}": kinds.get(a, "none") for a in self.architectures}


FAMILIES = {
    "llama": Family("Llama"),
    "qwen2": Family("Qwen2", qkv_bias=True, o_bias=False),
    "qwen3": Family("Qwen3", qk_norm=True),
    "mistral": Family("Mistral", qkv_bias=False, o_bias=False, window_on_every_layer=True),
    "phi3": Family("Phi3", qkv_bias=False, o_bias=False, window_on_every_layer=True),
    "mixtral": Family(
        "Mixtral", qkv_bias=False, o_bias=False, moe=True, window_on_every_layer=True
    ),
    "gemma2": Family(
        "Gemma2",
        activation_key="hidden_activation",
        gemma=True,
        softcaps=("attn_logit_softcapping", "final_logit_softcapping"),
        sliding_window_pattern=2,
    ),
    "gemma3_text": Family(
        "Gemma3",
        qk_norm=True,
        activation_key="hidden_activation",
        gemma=True,
        local_rope=True,
        softcaps=("final_logit_softcapping",),  # its attention never passes its cap on
        sliding_window_pattern=6,
        architectures=("ForCausalLM", "TextModel"),
    ),
}
# Gemma's tanh caps, on the attention scores and on the logits: x becomes cap * tanh(x / cap).
SOFTCAPS = ("attn_logit_softcapping", "final_logit_softcapping")
# The MLP gate activations the model code has, by their transformers names.
ACTIVATIONS = ("silu", "gelu_pytorch_tanh")
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
    # The window of the layers that slide (None: every layer sees its whole context).
    sliding_window: int | None = None
    hidden_act: str = "silu"
    gemma: bool = False  # see Family.gemma
    attention_scale: float = 0.0  # 0: head_dim ** -0.5
    # Which layers slide, and the rope base they rotate with when it is their own.
    sliding_layers: tuple[bool, ...] = ()
    local_rope_theta: float | None = None
    # A mixture of experts: experts per layer and per token (0: a dense MLP).
    num_experts: int = 0
    experts_per_token: int = 0
    # Gemma's `SOFTCAPS` (None: uncapped).
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None

    @property
    def norm_offset(self) -> float:
        """What every RMSNorm adds to its weight: Gemma stores the weight less one."""
        return 1.0 if self.gemma else 0.0

    @property
    def embed_scale(self) -> float:
        """The embedding's multiplier on the way in (not as a tied LM head)."""
        return self.hidden_size**0.5 if self.gemma else 1.0

    @property
    def scale(self) -> float:
        """Attention's scale of q·k."""
        return self.attention_scale or self.head_dim**-0.5

    @property
    def head(self) -> str:
        """ "lm_head", "score" or "none": the part on top of the decoder."""
        return ARCHITECTURE_HEADS[self.architecture]

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
        theta, scaling, local_theta = _local_rope(raw) if family.local_rope else (*_rope(raw), None)
        sliding = _sliding_layers(raw, family)
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
            sliding_window=positive_int(raw, "sliding_window") if any(sliding) else None,
            hidden_act=_activation(raw, family.activation_key),
            gemma=family.gemma,
            attention_scale=_attention_scale(raw) if family.gemma else 0.0,
            sliding_layers=sliding,
            local_rope_theta=local_theta,
            **(_experts(raw) if family.moe else {}),
            **_softcaps(raw, family),
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


def _sliding_layers(raw: dict[str, Any], family: Family) -> tuple[bool, ...]:
    """Which layers attend through `sliding_window`. Mistral's window covers every layer;
    the others' only the layers `layer_types` marks sliding. Files older than `layer_types`
    say it another way: Qwen from `max_window_layers` on, when `use_sliding_window`; Gemma
    all but every `sliding_window_pattern`th layer (every other one in Gemma 2)."""
    layers = positive_int(raw, "num_hidden_layers")
    if raw.get("sliding_window") is None:
        return (False,) * layers
    if family.window_on_every_layer:
        return (True,) * layers
    layer_types = raw.get("layer_types")
    if layer_types is None:
        return _older_sliding_layers(raw, family, layers)
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        raise ContractError("layer_types", f"expected a list of {layers} layer types")
    unknown = set(layer_types) - {"full_attention", "sliding_attention"}
    if unknown:
        raise ContractError("layer_types", f"{sorted(unknown)} not supported")
    return tuple(kind == "sliding_attention" for kind in layer_types)


def _older_sliding_layers(raw: dict[str, Any], family: Family, layers: int) -> tuple[bool, ...]:
    if family.sliding_window_pattern:
        default = family.sliding_window_pattern
        pattern = positive_int(raw, "sliding_window_pattern", default=default)
        return tuple((i + 1) % pattern != 0 for i in range(layers))
    if not raw.get("use_sliding_window"):
        return (False,) * layers
    first = raw.get("max_window_layers") or 0
    return tuple(i >= first for i in range(layers))


def _experts(raw: dict[str, Any]) -> dict[str, int]:
    experts = positive_int(raw, "num_local_experts")
    per_token = positive_int(raw, "num_experts_per_tok")
    if per_token > experts:
        raise ContractError(
            "num_experts_per_tok", f"{per_token} exceeds num_local_experts {experts}"
        )
    return {"num_experts": experts, "experts_per_token": per_token}


def _activation(raw: dict[str, Any], key: str) -> str:
    value = raw.get(key, "silu")
    if value not in ACTIVATIONS:
        raise ContractError(key, f"{value!r} is not supported; known: {', '.join(ACTIVATIONS)}")
    return value


def _attention_scale(raw: dict[str, Any]) -> float:
    """Gemma scales q·k by query_pre_attn_scalar ** -0.5, not head_dim ** -0.5."""
    return positive_float(raw, "query_pre_attn_scalar") ** -0.5


def _local_rope(raw: dict[str, Any]) -> tuple[float, RopeScaling | None, float]:
    """Full layers' theta and scaling, and sliding layers' own theta (never scaled): per
    layer type in transformers 5's `rope_parameters`, else `rope_theta`, `rope_scaling` and
    `rope_local_base_freq`."""
    params = raw.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params:
        full = _rope({"rope_parameters": params["full_attention"]})
        local_theta, local_scaling = _rope(
            {"rope_parameters": params.get("sliding_attention") or {"rope_theta": 10000.0}}
        )
        if local_scaling is not None:
            raise ContractError("rope_parameters.sliding_attention", "scaling is not supported")
        return (*full, local_theta)
    local_theta = positive_float(raw, "rope_local_base_freq", default=10000.0)
    return (*_rope(raw), local_theta)


def _softcaps(raw: dict[str, Any], family: Family) -> dict[str, float | None]:
    """Each cap, a positive number or null. A cap the family's transformers code ignores is
    refused: applying it would part from transformers' tokens, dropping it from the config."""
    for key in SOFTCAPS:
        if raw.get(key) is not None and key not in family.softcaps:
            raise ContractError(key, f"not applied by transformers' {family.prefix} models")
    return {key: None if raw.get(key) is None else positive_float(raw, key) for key in SOFTCAPS}


def _reject_unsupported(raw: dict[str, Any]) -> None:
    """Refuse variants the model code would otherwise compute silently wrong."""
    if raw.get("use_bidirectional_attention"):
        raise ContractError("use_bidirectional_attention", "only causal attention is supported")
    factor = raw.get("partial_rotary_factor") or (raw.get("rope_parameters") or {}).get(
        "partial_rotary_factor", 1.0
    )
    if factor != 1.0:
        raise ContractError("partial_rotary_factor", "partial rotary is not supported")
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
