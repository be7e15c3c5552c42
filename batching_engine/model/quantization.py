"""Weight-only quantization: the linear layers (and a tied embedding) kept as int8 or int4.

Decoding one token reads every weight once, so a step takes about as long as its weights take
to stream from memory. Keeping them as int8 halves that against bfloat16 (quarters it against
float32); int4 halves it again. Activations stay in the model's dtype, except in the CPU
kernel's VNNI builds, which round them to int8 per block of 32 as llama.cpp does (below).

- int8: symmetric, one scale per output row (`w = q * scale`, q in -127..127);
- int4: asymmetric in groups of 32 along the input (`w = q * scale + min`, q in 0..15): exactly
  the scheme of GGUF's Q4_1 blocks, so a Q4_1 checkpoint re-quantizes to its own codes.

On CUDA the products are torch's kernels, which dequantize inside the matmul:
`_weight_int8pack_mm`, and `_weight_int4pack_mm` over the codes packed once for it. On the CPU
torch's fused kernels (`_weight_int8pack_mm`, `_weight_int4pack_mm_for_cpu`) took 6-8x (int8)
and 16-19x (int4) float32's time for one SmolLM2 decode step's matmuls at one row, and 86-99x
and 175-190x at 64 rows, on a 2-core AVX-512 EPYC (bench/quantized_matmul.py). So the CPU
path is this project's own kernel (`batching_engine.kernels.cpu_quantized_matmul`). Its float
builds (AVX2, AVX-512) read the codes directly for few rows and convert each strip once for
many: 0.3x float32's time at one row, 1.0x at 64. Its VNNI builds (AVX-512 VNNI, AVX-VNNI),
which `auto` picks where the CPU has them, multiply int8 codes of x by the weight's codes with
integer dot products: 1.2-3x faster again at one row and 2.4-3.4x at 64 (int8 x costs SmolLM2
under 1% perplexity against float x, `tests/batching_engine/test_quantization.py`). Where no
build can run, a layer
dequantizes its rows into a scratch buffer, a few MiB reused by every layer, and multiplies
through the same oneDNN linear as float32 (2.5-4x float32's time at one row, 1.5x at 64).

Both schemes are row-wise, so the loader fills a fused projection (q, k and v; gate and up)
shard by shard through `load_rows` and never holds more than one checkpoint tensor in float;
`finish` then lays the codes out as the forward pass reads them.

A tied embedding (the LM head of SmolLM2 and most small models, a fifth of its weights; Q8_0
in SmolLM2's GGUF) is kept as int8 rows in both modes: the lookup dequantizes the rows it
reads, and the LM head multiplies by all of them as any int8 layer does.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Final

import torch
import torch.nn.functional as F
from torch import nn

from batching_engine.kernels import cpu_build
from batching_engine.kernels import cpu_quantized_matmul as cpu_kernel
from batching_engine.model.layers import Linear, linear
from infergrid.errors import ContractError

INT4_GROUP_SIZE: Final = 32
# config.json key where the GGUF import records its linear weights' tensor type.
GGUF_WEIGHT_TYPE_KEY: Final = "gguf_weight_type"
# A GGUF tensor type -> the engine's mode that keeps its weights at about their size in the
# file, with at least their precision: 4-bit blocks as int4 groups of 32 (a Q4_K sub-block
# is one such group: a scale and a minimum over 32 codes of 0..15), 5- to 8-bit ones as int8
# rows. The import dequantized them; `auto` quantizes them again into these.
GGUF_MODES: Final = {
    "Q8_0": "int8",
    "Q6_K": "int8",
    "Q5_0": "int8",
    "Q5_1": "int8",
    "Q5_K": "int8",
    "Q4_0": "int4",
    "Q4_1": "int4",
    "Q4_K": "int4",
}
# GGUF tensor types that hold floats: nothing to keep quantized.
GGUF_FLOAT_TYPES: Final = ("F32", "F16", "BF16")
_INT4_INNER_K_TILES: Final = 8  # the CUDA kernel's packing; 2, 4 or 8
# The CPU path dequantizes at most this many weights at a time (8 MiB of float32): a SmolLM2
# projection in one piece, its LM head in 14.
DEQUANTIZE_CHUNK: Final = 1 << 21
_scratch = threading.local()  # each thread that runs the model has its own buffer


def quantize_int8_rows(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes int8 [rows, cols], scales float32 [rows]) with `weight ~= codes * scales[:, None]`."""
    weight = weight.float()
    scales = weight.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127
    codes = torch.round(weight / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return codes, scales


def quantize_int4_rows(
    weight: torch.Tensor, group_size: int = INT4_GROUP_SIZE
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes uint8 [rows, cols] in 0..15, scales and minima float32 [rows, cols / group])
    with `weight ~= codes * scale + min`, each group of `group_size` columns on its own."""
    rows, cols = weight.shape
    groups = weight.float().reshape(rows, cols // group_size, group_size)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)
    scales = ((high - low) / 15).clamp(min=torch.finfo(torch.float32).tiny)
    codes = torch.round((groups - low[..., None]) / scales[..., None]).clamp(0, 15)
    return codes.to(torch.uint8).reshape(rows, cols), scales, low


def dequantize_int4_rows(
    codes: torch.Tensor, scales: torch.Tensor, low: torch.Tensor
) -> torch.Tensor:
    """The float32 weight that `quantize_int4_rows`' output stands for."""
    rows, cols = codes.shape
    groups = codes.float().reshape(rows, scales.shape[1], -1)
    return (groups * scales[..., None] + low[..., None]).reshape(rows, cols)


def int4pack_scales_and_zeros(scales: torch.Tensor, low: torch.Tensor) -> torch.Tensor:
    """What torch's int4pack kernels take besides the codes: [groups, rows, 2] of each group's
    scale and midpoint, since they compute `(q - 8) * scale + midpoint`."""
    midpoints = low + 8 * scales
    return torch.stack([scales, midpoints], dim=-1).transpose(0, 1).contiguous()


def resolve_quantization(asked: str, model_dir: Path, device: torch.device) -> tuple[str, str]:
    """(none, int8 or int4, why) for the `quantization` setting.

    `auto` keeps a GGUF file's quantized weights quantized on a GPU, and on a CPU that can run
    the quantized kernel. Without it, quantized matmuls are slower than float32 there (see the
    module's note), so the CPU then holds the weights in the model's dtype.
    """
    on_cpu = device.type != "cuda"
    missing = cpu_kernel.available() if on_cpu else None
    path = f"; CPU kernel {cpu_build.target()}" if on_cpu and missing is None else ""
    if asked != "auto":
        slow = (
            f"; dequantizing path: no CPU kernel ({missing})" if missing and asked != "none" else ""
        )
        return asked, f"quantization {asked}" + (path if asked != "none" else slow)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    source = config.get(GGUF_WEIGHT_TYPE_KEY)
    if source is None or source in GGUF_FLOAT_TYPES:
        return "none", "auto: the checkpoint's weights are not quantized"
    mode = GGUF_MODES.get(source)
    if mode is None:
        return (
            "none",
            f"auto: {source} weights dequantized to floats: the engine has no {source} kernel",
        )
    if missing is not None:
        return "none", f"auto: {source} weights held as floats: no CPU quantized kernel ({missing})"
    return mode, f"auto: the checkpoint's {source} weights held as {mode}{path}"


class RowQuantized(nn.Module):
    """A weight held quantized row by row, which the loader fills through `load_rows`: int8
    codes and one scale a row here, int4 groups in `QuantizedLinear`."""

    rows: int
    columns: int
    codes: torch.Tensor
    scales: torch.Tensor

    @torch.no_grad()
    def load_rows(self, offset: int, weight: torch.Tensor) -> None:
        """Quantize float `weight` into rows `offset..offset + len(weight)`."""
        codes, scales = quantize_int8_rows(weight)
        rows = slice(offset, offset + weight.shape[0])
        self.codes[rows] = codes.to(self.codes.device)
        self.scales[rows] = scales.to(self.scales.dtype)

    def finish(self) -> None:
        """Ready the kernel's layout once every row is in."""


class QuantizedLinear(RowQuantized):
    """`x @ w.T` for a weight held as int8 rows or int4 groups (see the module's note).

    Built empty (on the meta device, like every module the loader fills); `load_rows` takes
    float rows of the weight as the checkpoint has them, `finish` lays the codes out for the
    device: packed for torch's kernel on CUDA, two codes a byte for the CPU path.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        mode: str,
        dtype: torch.dtype,
        bias: bool = False,
    ) -> None:
        super().__init__()
        # Kept in float, added after the product (Qwen2's q/k/v biases).
        self.bias = nn.Parameter(torch.empty(out_features, dtype=dtype)) if bias else None
        if mode == "int4" and in_features % INT4_GROUP_SIZE:
            raise ContractError(
                "quantization",
                f"int4 needs layer widths divisible by {INT4_GROUP_SIZE}, got {in_features}",
            )
        self.rows, self.columns, self.mode = out_features, in_features, mode
        # Laid out for the CPU kernel (`finish`): the buffers below, as it reads them.
        self.packed: cpu_kernel.PackedWeight | None = None
        code_type = torch.int8 if mode == "int8" else torch.uint8
        self.register_buffer("codes", torch.empty(out_features, in_features, dtype=code_type))
        if mode == "int8":
            self.register_buffer("scales", torch.empty(out_features, dtype=dtype))
        else:
            groups = in_features // INT4_GROUP_SIZE
            self.register_buffer("scales", torch.empty(out_features, groups, dtype=dtype))
            self.register_buffer("low", torch.empty(out_features, groups, dtype=dtype))

    @torch.no_grad()
    def load_rows(self, offset: int, weight: torch.Tensor) -> None:
        if self.mode == "int8":
            super().load_rows(offset, weight)
            return
        rows = slice(offset, offset + weight.shape[0])
        codes, scales, low = quantize_int4_rows(weight)
        self.low[rows] = low.to(self.low.dtype)
        self.codes[rows] = codes.to(self.codes.device)
        self.scales[rows] = scales.to(self.scales.dtype)

    @torch.no_grad()
    def finish(self) -> None:
        """On the CPU, the kernel's strips (`cpu_quantized_matmul`) where it is built, else
        int4 codes two a byte for the dequantizing path. On CUDA, int4 codes, scales and
        midpoints in torch's kernel's packing (it computes (q - 8) * scale + zero)."""
        if not self.codes.is_cuda and cpu_kernel.available() is None:
            if self.mode == "int8":
                self.packed = cpu_kernel.pack_int8(self.codes, self.scales)
            else:
                self.packed = cpu_kernel.pack_int4(self.codes, self.scales, self.low)
                self.low = self.packed.lows
            self.codes, self.scales = self.packed.codes, self.packed.scales  # same tensors
            return
        if self.mode != "int4":
            return
        nibbles = cpu_kernel.nibble_pairs(self.codes)
        if not self.codes.is_cuda:
            self.codes = nibbles
            return
        scales_and_zeros = int4pack_scales_and_zeros(self.scales, self.low)
        packed = torch.ops.aten._convert_weight_to_int4pack(nibbles, _INT4_INNER_K_TILES)
        for name in ("codes", "scales", "low"):
            delattr(self, name)
        self.register_buffer("packed_weight", packed, persistent=False)
        self.register_buffer("packed_scales", scales_and_zeros, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._product(x)
        return out if self.bias is None else out.add_(self.bias)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            return cpu_kernel.matmul(x, self.packed)
        if not x.is_cuda:
            fill = _int8_rows(self.codes, self.scales) if self.mode == "int8" else self._int4_rows
            return dequantized_linear(x, self.rows, self.columns, fill)
        if self.mode == "int8":
            return torch.ops.aten._weight_int8pack_mm(x.contiguous(), self.codes, self.scales)
        return torch.ops.aten._weight_int4pack_mm(
            x.contiguous(), self.packed_weight, INT4_GROUP_SIZE, self.packed_scales
        )

    def _int4_rows(self, rows: slice, out: torch.Tensor) -> None:
        """Rows of the weight into `out`: each byte's two codes, then `q * scale + min`."""
        pairs = out.view(out.shape[0], -1, 2)
        nibbles = self.codes[rows]
        pairs[..., 0] = nibbles >> 4
        pairs[..., 1] = nibbles & 15
        groups = out.view(out.shape[0], -1, INT4_GROUP_SIZE)
        groups.mul_(self.scales[rows, :, None]).add_(self.low[rows, :, None])


class QuantizedEmbedding(RowQuantized):
    """A token embedding held as int8 rows; doubles as the LM head of a tied model."""

    def __init__(
        self, num_embeddings: int, dim: int, dtype: torch.dtype, scale: float = 1.0
    ) -> None:
        super().__init__()
        self.rows, self.columns = num_embeddings, dim
        self.scale = scale  # as `Embedding.scale`: on lookups only
        self.packed: cpu_kernel.PackedWeight | None = None  # as in QuantizedLinear
        self.register_buffer("codes", torch.empty(num_embeddings, dim, dtype=torch.int8))
        self.register_buffer("scales", torch.empty(num_embeddings, dtype=dtype))

    @torch.no_grad()
    def finish(self) -> None:
        """On the CPU, the kernel's strips where it is built: the LM head is its largest
        matmul, and a lookup reads its few rows back out of them."""
        if not self.codes.is_cuda and cpu_kernel.available() is None:
            self.packed = cpu_kernel.pack_int8(self.codes, self.scales)
            self.codes, self.scales = self.packed.codes, self.packed.scales  # same tensors

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        looked_up = self._rows_of(ids)
        if self.scale == 1.0:
            return looked_up
        return looked_up * torch.tensor(self.scale, dtype=looked_up.dtype)

    def _rows_of(self, ids: torch.Tensor) -> torch.Tensor:
        if self.packed is not None:
            codes = cpu_kernel.unpack_int8_rows(self.packed, ids.reshape(-1))
            scales = self.scales.reshape(-1)[ids.reshape(-1), None]
            return (codes.to(scales.dtype) * scales).view(*ids.shape, self.columns)
        return F.embedding(ids, self.codes).to(self.scales.dtype) * self.scales[ids, None]

    def as_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits over the vocabulary: the embedding rows as the LM head's weight."""
        if self.packed is not None:
            return cpu_kernel.matmul(hidden, self.packed)
        if hidden.is_cuda:
            return torch.ops.aten._weight_int8pack_mm(hidden.contiguous(), self.codes, self.scales)
        fill = _int8_rows(self.codes, self.scales)
        return dequantized_linear(hidden, self.rows, self.columns, fill)


Fill = Callable[[slice, torch.Tensor], None]


def dequantized_linear(x: torch.Tensor, rows: int, columns: int, fill: Fill) -> torch.Tensor:
    """`x @ w.T` on the CPU, `fill(rows, out)` writing float rows of `w` into the thread's
    scratch buffer, at most DEQUANTIZE_CHUNK weights at a time."""
    step = max(1, DEQUANTIZE_CHUNK // columns)
    if rows <= step:
        weight = _scratch_rows(rows, columns, x.dtype)
        fill(slice(0, rows), weight)
        return linear(x, weight)
    out = x.new_empty(*x.shape[:-1], rows)
    for start in range(0, rows, step):
        chunk = slice(start, min(rows, start + step))
        weight = _scratch_rows(chunk.stop - start, columns, x.dtype)
        fill(chunk, weight)
        out[..., chunk] = linear(x, weight)
    return out


def _scratch_rows(rows: int, columns: int, dtype: torch.dtype) -> torch.Tensor:
    """A [rows, columns] view of this thread's buffer, grown (never shrunk) to fit: allocated
    once, since a fresh multi-MiB tensor per layer cost page faults that took longer than
    the matmul."""
    buffer = getattr(_scratch, "buffer", None)
    if buffer is None or buffer.numel() < rows * columns or buffer.dtype != dtype:
        with torch.inference_mode(False):  # a plain tensor: written in and out of that mode
            buffer = _scratch.buffer = torch.empty(rows * columns, dtype=dtype)
    return buffer[: rows * columns].view(rows, columns)


def _int8_rows(codes: torch.Tensor, scales: torch.Tensor) -> Fill:
    def fill(rows: slice, out: torch.Tensor) -> None:
        torch.mul(codes[rows], scales[rows, None], out=out)

    return fill


def quantize_modules(model: nn.Module, mode: str, dtype: torch.dtype) -> None:
    """Swap, in place, a Llama model's projections (and LM head, or the embedding it is tied
    to) for quantized ones, before the loader fills them. A classifier's score head and a
    mixture's router, a few rows each, stay as they are: a rounded router could pick other
    experts."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, Linear) and name not in ("score", "gate"):
                bias = child.bias is not None
                swapped = QuantizedLinear(
                    child.in_features, child.out_features, mode, dtype, bias=bias
                )
                setattr(module, name, swapped)
    lm_head = getattr(model, "lm_head", False)
    if lm_head is None:  # tied: the embedding is the head
        embedding = model.model.embed_tokens
        model.model.embed_tokens = QuantizedEmbedding(
            *embedding.weight.shape, dtype, scale=embedding.scale
        )
