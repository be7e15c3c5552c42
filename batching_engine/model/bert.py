"""The BERT encoder over one flat batch of whole sequences, and its classification head.

Like the Llama decoder there is no batch dimension: tokens of every sequence are concatenated
([num_tokens, hidden]), so the linear layers run one matmul per step whatever the lengths. Only
attention needs the sequences apart; it pads them to the longest and masks the padding keys
(`PaddedLayout`), which changes no real token's result. Layers are post-LN, as in BERT: each
sublayer's output is added to its input, then normed.

Parameter names are shorter than HF's (`layers.3.attention.qkv_proj` for
`encoder.layer.3.attention.self.{query,key,value}`); the loader maps them, filling the fused
q/k/v projection shard by shard. BERT's pooler is built only for classification: embeddings
pool the token states instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from batching_engine.model.attention import DenseAttentionMetadata
from batching_engine.model.bert_config import BertConfig
from batching_engine.model.heads import first_token_states
from batching_engine.model.layers import Linear

# config.hidden_act -> the function transformers' ACT2FN gives for it.
ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
}


@dataclass(frozen=True, slots=True)
class PaddedLayout:
    """Where each token of the flat batch sits in a [num_seqs, longest] padded one."""

    owner: torch.Tensor  # [num_tokens]: its sequence
    positions: torch.Tensor  # [num_tokens]: its position in that sequence
    key_mask: torch.Tensor  # [num_seqs, 1, 1, longest] bool: True where a real token is
    longest: int

    @classmethod
    def of(cls, meta: DenseAttentionMetadata) -> PaddedLayout:
        device = meta.positions.device
        lens = torch.tensor(meta.seq_lens_host, device=device)
        longest = max(meta.seq_lens_host)
        owner = torch.repeat_interleave(torch.arange(len(lens), device=device), lens)
        real = torch.arange(longest, device=device)[None, :] < lens[:, None]
        return cls(owner, meta.positions, real[:, None, None, :], longest)

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        """[num_tokens, heads, head_dim] -> [num_seqs, heads, longest, head_dim], zero-padded."""
        padded = x.new_zeros(self.key_mask.shape[0], self.longest, *x.shape[1:])
        padded[self.owner, self.positions] = x
        return padded.transpose(1, 2)

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        return padded.transpose(1, 2)[self.owner, self.positions]


class BertAttention(nn.Module):
    """Bidirectional multi-head self-attention, q, k and v from one fused projection."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.qkv_proj = Linear(config.hidden_size, 3 * config.hidden_size)
        self.o_proj = Linear(config.hidden_size, config.hidden_size)

    def forward(self, x: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).view(-1, 3, self.num_heads, self.head_dim).unbind(dim=1)
        out = F.scaled_dot_product_attention(
            layout.pad(q), layout.pad(k), layout.pad(v), attn_mask=layout.key_mask
        )
        return self.o_proj(layout.unpad(out).reshape(x.shape))


class BertMLP(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.act = ACTIVATIONS[config.hidden_act]
        self.up_proj = Linear(config.hidden_size, config.intermediate_size)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.up_proj(x)))


class BertLayer(nn.Module):
    """Attention, add, norm; MLP, add, norm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = BertMLP(config)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, layout: PaddedLayout) -> torch.Tensor:
        x = self.attention_norm(self.attention(x, layout) + x)
        return self.mlp_norm(self.mlp(x) + x)


class BertEmbeddings(nn.Module):
    """Word + token type (always 0: one text per input) + absolute position, then a norm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        x = self.word_embeddings(input_ids) + self.token_type_embeddings.weight[0]
        return self.norm(x + self.position_embeddings(positions))


class BertModel(nn.Module):
    """Embeddings and encoder layers: token ids in, the last layer's states out."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.embeddings = BertEmbeddings(config)
        self.layers = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, input_ids: torch.Tensor, meta: DenseAttentionMetadata) -> torch.Tensor:
        """input_ids: [num_tokens] of whole sequences; returns [num_tokens, hidden]."""
        layout = PaddedLayout.of(meta)
        hidden = self.embeddings(input_ids, meta.positions)
        for layer in self.layers:
            hidden = layer(hidden, layout)
        return hidden


class BertForSequenceClassification(nn.Module):
    """The encoder, BERT's pooler (tanh of a projection of the [CLS] state) and a classifier."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.model = BertModel(config)
        self.pooler = Linear(config.hidden_size, config.hidden_size)
        self.classifier = Linear(config.hidden_size, config.num_labels)

    def forward(self, input_ids: torch.Tensor, meta: DenseAttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, meta)

    def classify(self, hidden: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """Class logits, [num_seqs, num_labels]."""
        pooled = torch.tanh(self.pooler(first_token_states(hidden, seq_lens)))
        return self.classifier(pooled).float()
