"""The dense layers of a decoder block: linear projections, RMSNorm and the gated MLP.

RMSNorm and the MLP's gate call `batching_engine.kernels.dispatch` (a Triton kernel on CUDA, its
torch reference elsewhere), which rounds where Hugging Face's Llama rounds, so greedy tokens stay
equal.

Linear layers on the CPU in float32 multiply through oneDNN, which torch ships but calls for
float32 only on request. torch's default there is MKL, whose kernels on an AMD CPU reached
100-220 GFLOP/s where oneDNN's reach 180-470 (AVX-512 on a 2-core EPYC): a SmolLM2 decode step
took 1.5x as long through MKL. Both are exact float32 products (no reduced-precision
accumulation). `pack_linears` then swaps each weight for oneDNN's blocked copy of it (the same
bytes, laid out as its kernel reads them), once, which made those matmuls another 15-25% faster
with bit-identical results.

The MLP's gate and up projections live in one weight (`gate_up_proj`, gate rows first) so a
step does one large matmul instead of two; the loader fills each half from the checkpoint's
separate `gate_proj` and `up_proj` tensors.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from batching_engine.kernels import dispatch
from batching_engine.model.tensor_parallel import SINGLE, TensorParallel, mlp_columns

# Decided once, at import: oneDNN's linear where this torch build has it.
ONEDNN_LINEAR = torch.backends.mkldnn.is_available() and all(
    hasattr(torch.ops.mkldnn, op) for op in ("_linear_pointwise", "_reorder_linear_weight")
)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias`, through oneDNN for float32 CPU tensors (see the module's note)."""
    if ONEDNN_LINEAR and x.dtype == torch.float32 and x.device.type == "cpu":
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters and names, so the loader fills it alike) through `linear`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)

    def pack(self, batch_size: int) -> None:
        """Replace the weight by oneDNN's blocked copy, laid out for `batch_size`-row inputs
        (others work too): a buffer then, no longer a parameter, as it is no plain tensor."""
        packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), batch_size)
        del self.weight
        self.register_buffer("weight", packed, persistent=False)


def pack_linears(model: nn.Module, batch_size: int) -> bool:
    """Pack every `Linear` of a float32 model on the CPU (see `Linear.pack`); False, changing
    nothing, anywhere else. A tied LM head stays plain: it is the embedding table too."""
    weights = [m.weight for m in model.modules() if isinstance(m, Linear)]
    if not ONEDNN_LINEAR or any(w.dtype != torch.float32 or w.is_cuda for w in weights):
        return False
    for module in model.modules():
        if isinstance(module, Linear):
            module.pack(batch_size)
    return True


class Embedding(nn.Embedding):
    """nn.Embedding that can also serve as a tied LM head, as `QuantizedEmbedding` does.
    `scale` multiplies what it looks up (Gemma's sqrt(hidden_size), rounded to the weight's
    dtype as transformers rounds it), never what it gives as a head."""

    def __init__(self, num_embeddings: int, embedding_dim: int, scale: float = 1.0) -> None:
        super().__init__(num_embeddings, embedding_dim)
        self.scale = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        looked_up = super().forward(ids)
        if self.scale == 1.0:
            return looked_up
        return looked_up * torch.tensor(self.scale, dtype=looked_up.dtype)

    def as_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary: the embedding rows as the LM head's weight."""
        return linear(hidden, self.weight)


class RMSNorm(nn.Module):
    """Scale by the reciprocal root-mean-square, computed in float32 as HF Llama does.

    With a residual, the residual is added first and the sum returned too: the add-then-norm
    of a pre-norm block, one pass over memory in the fused kernel.
    """

    def __init__(self, hidden_size: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.offset = offset  # Gemma's checkpoints hold the weight less one

    @torch.no_grad()
    def finish(self) -> None:
        """Fold the offset into the loaded weight, once: what Gemma computes as x * (1 + w)
        in float32 is then this norm's x * w'."""
        if self.offset:
            self.weight.add_(self.offset)
            self.offset = 0.0

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual); without a residual, (norm(x), x)."""
        return dispatch.fused_add_rmsnorm(x, residual, self.weight, self.eps)


class SwiGLUMLP(nn.Module):
    """down(act(gate(x)) * up(x)), with gate and up fused into one projection: act is silu
    (SwiGLU, through the fused kernel) or GELU's tanh form (Gemma's GeGLU, in torch). Under
    tensor parallelism it holds this rank's intermediate columns and sums `down`'s output."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        tp: TensorParallel = SINGLE,
        activation: str = "silu",
    ) -> None:
        super().__init__()
        self.tp = tp
        self.activation = activation
        self.intermediate_size = len(mlp_columns(intermediate_size, tp))
        self.gate_up_proj = Linear(hidden_size, 2 * self.intermediate_size, bias=False)
        self.down_proj = Linear(self.intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_reduce(self.partial(x))

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's share of the output, before the sum over ranks (which a mixture of
        experts makes once for all its experts)."""
        return self.down_proj(self._gate(self.gate_up_proj(x)))

    def _gate(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self.activation == "silu":
            return dispatch.silu_and_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return F.gelu(gate, approximate="tanh") * up
