"""The small dense layers of a Llama block: RMSNorm and the SwiGLU MLP.

The MLP's gate and up projections live in one weight (`gate_up_proj`, gate rows first) so a
step does one large matmul instead of two; the loader fills each half from the checkpoint's
separate `gate_proj` and `up_proj` tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Scale by the reciprocal root-mean-square, computed in float32 as HF Llama does.

    With a residual, the residual is added first and the sum returned too (the fused
    add-then-norm shape of a pre-norm block, which a kernel can do in one pass).
    """

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual); without a residual, (norm(x), x)."""
        if residual is not None:
            x = x + residual
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype), x


class SwiGLUMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one projection."""

    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        return self.down_proj(F.silu(gate) * up)
