"""Rotary position embedding's cos/sin table, computed once per model.

Tokens of many sequences arrive flattened, each with its own position, so the table is
indexed by position instead of being rebuilt per step; the rotation itself is
`dispatch.rotary_embedding`. It pairs dimension i with i + head_dim/2 (HF's "rotate half"
layout), which is what HF-format weights expect; the table is [max_positions, head_dim] with
both halves repeated, as the Triton rotary kernel reads it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from batching_engine.model.config import RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """One frequency per rotated pair, stretched for long context when the model asks."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "llama3":
        return _llama3_frequencies(inv_freq, scaling)
    raise ValueError(f"rope scaling kind {scaling.kind!r} is not implemented")


def _llama3_frequencies(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1's rule: keep short wavelengths, divide long ones by `factor`, blend between."""
    original = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    long_wavelength = original / scaling.low_freq_factor
    short_wavelength = original / scaling.high_freq_factor
    stretched = torch.where(wavelength > long_wavelength, inv_freq / scaling.factor, inv_freq)
    blend = (original / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - blend) * stretched / scaling.factor + blend * stretched
    in_between = (wavelength >= short_wavelength) & (wavelength <= long_wavelength)
    return torch.where(in_between, blended, stretched)


class RotaryEmbedding(nn.Module):
    """The cos and sin of every position's angles: [max_positions, head_dim] buffers."""

    def __init__(
        self, head_dim: int, max_positions: int, theta: float, scaling: RopeScaling | None
    ) -> None:
        super().__init__()
        self.head_dim, self.max_positions = head_dim, max_positions
        self.theta, self.scaling = theta, scaling
        self.register_buffer("cos", torch.empty(max_positions, head_dim), persistent=False)
        self.register_buffer("sin", torch.empty(max_positions, head_dim), persistent=False)
        self.reset_tables()

    @torch.no_grad()
    def reset_tables(self) -> None:
        """Fill the table in place; the loader calls this once a meta-device model is real."""
        if self.cos.is_meta:
            return
        inv_freq = inverse_frequencies(self.head_dim, self.theta, self.scaling)
        positions = torch.arange(self.max_positions, dtype=torch.int64).float()
        angles = (positions[:, None] * inv_freq).repeat(1, 2).to(self.cos.device)
        self.cos.copy_(angles.cos())
        self.sin.copy_(angles.sin())
