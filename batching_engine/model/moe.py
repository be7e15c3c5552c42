"""A sparse mixture of experts (Mixtral's): each token runs through `top_k` of the layer's
expert MLPs, chosen by a router, and gets their outputs weighted by the router.

The arithmetic follows transformers' Mixtral step for step, so greedy tokens stay equal: the
router's softmax in float32, the top-k probabilities renormalised to sum to one, each expert
applied to the tokens routed to it, in expert order, its output scaled and added into the
token's row. Under tensor parallelism every rank holds each expert's share of intermediate
columns (as a dense MLP's) and the router whole; the weighted sum is all-reduced once.
"""

from __future__ import annotations

import torch
from torch import nn

from batching_engine.model.layers import Linear, SwiGLUMLP
from batching_engine.model.tensor_parallel import SINGLE, TensorParallel


class SparseMoE(nn.Module):
    """Named as transformers saves Mixtral: `gate` (the router) and `experts.<e>`, whose
    w1/w3 the loader fills into each expert's fused `gate_up_proj` and w2 into `down_proj`."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_experts: int,
        top_k: int,
        tp: TensorParallel = SINGLE,
        activation: str = "silu",
    ) -> None:
        super().__init__()
        self.tp, self.top_k = tp, top_k
        self.gate = Linear(hidden_size, num_experts, bias=False)
        self.experts = nn.ModuleList(
            SwiGLUMLP(hidden_size, intermediate_size, tp, activation) for _ in range(num_experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.gate(x).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights /= weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for expert in chosen.unique().tolist():
            tokens, slot = torch.where(chosen == expert)
            y = self.experts[expert].partial(x[tokens]) * weights[tokens, slot, None]
            out.index_add_(0, tokens, y.to(out.dtype))
        return self.tp.all_reduce(out)
