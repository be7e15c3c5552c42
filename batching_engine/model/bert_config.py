"""The BERT-family encoder settings the engine needs (MiniLM, BGE and other BERT checkpoints),
read from an HF `config.json` with model_type "bert".

As for Llama, only what the model code uses is kept and every variant it would compute wrong
(relative positions, a causal decoder, cross-attention, an unknown activation) is refused at
load time, naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from batching_engine.model.config_fields import (
    num_labels,
    one_architecture,
    positive_float,
    positive_int,
)
from infergrid.errors import ContractError

# What each architecture puts on top of the encoder.
ARCHITECTURE_HEADS = {
    "BertModel": "none",
    "BertForSequenceClassification": "classifier",
}
# config.json's hidden_act values the model code implements (transformers' ACT2FN names).
HIDDEN_ACTS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")


@dataclass(frozen=True, slots=True)
class BertConfig:
    """One BERT encoder's shape and numerics."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    hidden_act: str
    layer_norm_eps: float
    max_position_embeddings: int
    type_vocab_size: int
    num_labels: int = 0

    @property
    def head(self) -> str:
        """ "classifier" or "none": the part on top of the encoder (never an LM head)."""
        return ARCHITECTURE_HEADS[self.architecture]

    @property
    def num_key_value_heads(self) -> int:
        """Plain multi-head attention: one K/V head per query head."""
        return self.num_attention_heads

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> BertConfig:
        architecture = one_architecture(raw, "BertModel", ARCHITECTURE_HEADS)
        _reject_unsupported(raw)
        hidden_size = positive_int(raw, "hidden_size")
        num_heads = positive_int(raw, "num_attention_heads")
        if hidden_size % num_heads:
            raise ContractError(
                "num_attention_heads", f"{num_heads} does not divide hidden_size {hidden_size}"
            )
        return cls(
            architecture=architecture,
            vocab_size=positive_int(raw, "vocab_size"),
            hidden_size=hidden_size,
            intermediate_size=positive_int(raw, "intermediate_size"),
            num_hidden_layers=positive_int(raw, "num_hidden_layers"),
            num_attention_heads=num_heads,
            head_dim=hidden_size // num_heads,
            hidden_act=raw.get("hidden_act", "gelu"),
            layer_norm_eps=positive_float(raw, "layer_norm_eps", default=1e-12),
            max_position_embeddings=positive_int(raw, "max_position_embeddings", default=512),
            type_vocab_size=positive_int(raw, "type_vocab_size", default=2),
            num_labels=num_labels(raw) if architecture == "BertForSequenceClassification" else 0,
        )


def _reject_unsupported(raw: dict[str, Any]) -> None:
    """Refuse variants the model code would otherwise compute silently wrong."""
    act = raw.get("hidden_act", "gelu")
    if act not in HIDDEN_ACTS:
        raise ContractError(
            "hidden_act", f"{act!r} is not supported; known: {', '.join(HIDDEN_ACTS)}"
        )
    positions = raw.get("position_embedding_type", "absolute")
    if positions != "absolute":
        raise ContractError(
            "position_embedding_type", f"{positions!r} is not supported; only 'absolute'"
        )
    for flag in ("is_decoder", "add_cross_attention"):
        if raw.get(flag):
            raise ContractError(flag, "only a bidirectional encoder is supported")
