"""What single-pass tasks put on top of the model: pooled embeddings and a classifier.

Both read the final hidden states of whole sequences from one flat batch, so the pooling is
a segment reduction over `seq_lens`, not a loop over sequences.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from batching_engine.model.attention import DenseAttentionMetadata
from batching_engine.model.config import LlamaConfig
from batching_engine.model.layers import Linear
from batching_engine.model.llama import LlamaModel

POOLING_MODES = ("mean", "last", "cls")


def pool_embeddings(
    hidden: torch.Tensor, seq_lens: torch.Tensor, mode: str, *, normalize: bool = True
) -> torch.Tensor:
    """One vector per sequence from [num_tokens, hidden] states, L2-normalised by default.

    "mean" averages every token of the sequence; "last" takes its final token, which is the
    only one that has seen the whole text under causal attention; "cls" takes its first token
    (an encoder's [CLS]).
    """
    if mode == "last":
        pooled = last_token_states(hidden, seq_lens)
    elif mode == "cls":
        pooled = first_token_states(hidden, seq_lens)
    elif mode == "mean":
        owner = torch.repeat_interleave(torch.arange(len(seq_lens), device=hidden.device), seq_lens)
        sums = hidden.float().new_zeros(len(seq_lens), hidden.shape[-1])
        sums.index_add_(0, owner, hidden.float())
        pooled = sums / seq_lens.to(sums.dtype)[:, None]
    else:
        raise ValueError(f"pooling mode {mode!r} is not one of {POOLING_MODES}")
    return F.normalize(pooled.float(), p=2, dim=-1) if normalize else pooled.float()


def last_token_states(hidden: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """The hidden state of each sequence's final token."""
    return hidden[torch.cumsum(seq_lens, dim=0) - 1]


def first_token_states(hidden: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    """The hidden state of each sequence's first token."""
    return hidden[torch.cumsum(seq_lens, dim=0) - seq_lens]


class LlamaForSequenceClassification(nn.Module):
    """The decoder plus HF's `score` head, read at each sequence's last token."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.model = LlamaModel(config)
        self.score = Linear(config.hidden_size, config.num_labels, bias=False)

    def forward(self, input_ids: torch.Tensor, meta: DenseAttentionMetadata) -> torch.Tensor:
        return self.model(input_ids, meta)

    def classify(self, hidden: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
        """Class logits, [num_seqs, num_labels]."""
        return self.score(last_token_states(hidden, seq_lens)).float()
