"""A decode step's decoder layers and final norm in one native call, on the CPU in float32
(`cpu_decode_step.c`): the model's modules do the same work in about 15 Python calls a layer,
which took longer than the kernels they call. A SmolLM2-135M decode step (int4, forward and
LM head) took 9.2 ms through the modules and 3.5 ms in one call at batch 1, 24.5 and 16.5 ms
at batch 16, on a 2-core AVX-512 EPYC (bench/decode_step.py).

It applies to a step whose every sequence has one query token, on a model whose layers are
all plain pre-norm Llama blocks (no Gemma sandwich) with a SiLU-gated MLP (no experts), whose
every projection is packed for the CPU quantized matmul, on one rank, with float32 CPU
tensors (the KV caches float16, the engine's there, or float32) and the kernel switch not
forcing torch (`INFERGRID_KERNELS=torch` keeps the modules:
they are the reference). Anything else runs the modules, unchanged.

The model is described to C once, at its first such step (`describe`): an array of per-layer
structs of pointers into its tensors, kept alive by the description. A step then passes only
its own tensors; the C side checks each of their indices before it writes anything.
"""

from __future__ import annotations

import ctypes
import weakref
from pathlib import Path
from typing import Final

import torch

from batching_engine.kernels import cpu_build, cpu_decode, dispatch
from batching_engine.kernels import cpu_quantized_matmul as quantized
from batching_engine.model.attention import PagedAttentionMetadata
from batching_engine.model.layers import RMSNorm, SwiGLUMLP
from batching_engine.model.quantization import QuantizedLinear

# A layer's (K, V) cache, as `model.llama.KVCache`. The model is a `model.llama.LlamaModel`,
# known here as a plain module (and its layers by their `plain_pre_norm` flag): llama.py
# imports this module, which therefore imports nothing of llama's.
KVCache = tuple[torch.Tensor, torch.Tensor]

SOURCE: Final = Path(__file__).with_suffix(".c")
_INCLUDED: Final = Path(__file__).with_name("cpu_decode.c")
_P, _I64, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
PROJECTIONS: Final = ("qkv", "o", "gate_up", "down")
# decode_step's nonzero statuses (StepStatus) -> what went wrong.
FAILURES: Final = {
    1: "the model's description disagrees with its sizes",
    2: "a position is outside the rotary table",
    3: "a slot is outside the KV cache",
    4: "a context length is longer than its block table",
    5: "a block id is outside the KV cache",
}
_NO_MEMORY: Final = 6


class _Projection(ctypes.Structure):
    _fields_ = [("mode", _I64), ("n", _I64), ("k", _I64), ("codes", _P), ("scales", _P),
                ("lows", _P), ("bias", _P)]  # fmt: skip


class _Layer(ctypes.Structure):
    _fields_ = [
        *((name, _Projection) for name in PROJECTIONS),
        *((name, _P) for name in ("input_norm", "post_norm", "q_norm", "k_norm", "cos", "sin",
                                  "k_cache", "v_cache")),
        *((name, _I64) for name in ("max_positions", "rotary_dim", "window", "num_blocks")),
        *((name, _F) for name in ("input_eps", "post_eps", "qk_eps", "scale", "softcap")),
    ]  # fmt: skip


class _Model(ctypes.Structure):
    _fields_ = [
        *((name, _I64) for name in ("num_layers", "hidden", "heads", "kv_heads", "head_dim",
                                    "intermediate", "block_size", "kv_half")),
        ("layers", ctypes.POINTER(_Layer)), ("final_norm", _P), ("final_eps", _F),
        ("matmul", _P),
    ]  # fmt: skip


def _declare(library: ctypes.CDLL) -> None:
    library.decode_step_scratch.argtypes = [_P, _I64]
    library.decode_step_scratch.restype = _I64
    library.decode_step.argtypes = [_P, _P, _I64, _P, _P, _P, _I64, _P, _P, _I64, _P]
    library.decode_step.restype = ctypes.c_int


def _library() -> ctypes.CDLL | str:
    """Built as cpu_decode.c, which it includes: rotary rounds as torch does only without
    fused multiply-adds (that file's note)."""
    return cpu_build.load(SOURCE, _declare, ("-ffp-contract=off",), (_INCLUDED,))


def available() -> str | None:
    """None when both libraries the step calls are ready; else why one cannot be used."""
    for library in (_library(), quantized._library()):
        if isinstance(library, str):
            return library
    return None


class DecodeStep:
    """One model described to C, and the KV caches its layers point into (`attach`)."""

    def __init__(self, model: torch.nn.Module, library: ctypes.CDLL, matmul: ctypes.CDLL) -> None:
        attention, mlp = model.layers[0].self_attn, model.layers[0].mlp
        self.tensors: list[torch.Tensor] = []  # what the description points into, kept alive
        self.layers = (_Layer * len(model.layers))(
            *(self._layer(model, index) for index in range(len(model.layers)))
        )
        self.model = _Model(
            num_layers=len(model.layers), hidden=model.norm.weight.shape[0],
            heads=attention.num_heads, kv_heads=attention.num_kv_heads,
            head_dim=attention.head_dim, intermediate=mlp.intermediate_size,
            layers=self.layers, final_norm=self._pointer(model.norm.weight),
            final_eps=model.norm.eps,
            matmul=ctypes.cast(matmul.quantized_matmul, ctypes.c_void_p).value,
        )  # fmt: skip
        self.address = ctypes.addressof(self.model)
        self.library = library
        self.caches: list[KVCache] = []
        self.scratch = torch.empty(0)  # grown to the largest step's need, reused

    def attach(self, kv_caches: list[KVCache]) -> bool:
        """Point the layers at these caches (once per set of caches); False, pointing at
        nothing new, when they are not one contiguous float16 or float32 [blocks, block_size,
        kv_heads, head_dim] pair a layer, all alike."""
        if len(kv_caches) == len(self.caches) and all(
            new is old for new, old in zip(kv_caches, self.caches, strict=True)
        ):
            return True
        shape = (self.model.kv_heads, self.model.head_dim)
        first = kv_caches[0][0] if kv_caches else None
        if first is None or len(kv_caches) != len(self.layers) or first.shape[2:] != shape:
            return False
        if not all(
            cpu_decode.holds(k, v) and all(_alike(c, first) for c in (k, v)) for k, v in kv_caches
        ):
            return False
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            layer.k_cache, layer.v_cache = k_cache.data_ptr(), v_cache.data_ptr()
            layer.num_blocks = first.shape[0]
        self.model.block_size, self.model.kv_half = first.shape[1], first.dtype == torch.float16
        self.caches = list(kv_caches)
        return True

    def __call__(self, hidden: torch.Tensor, meta: PagedAttentionMetadata) -> torch.Tensor:
        """The normed hidden states [tokens, hidden] of a decode-only step from its embedded
        tokens; the step's K/V written into the attached caches."""
        tokens = hidden.shape[0]
        positions, slots = _as(meta.positions, torch.int64), _as(meta.slot_mapping, torch.int64)
        tables, lens = _as(meta.block_tables, torch.int32), _as(meta.context_lens, torch.int32)
        if hidden.shape != (tokens, self.model.hidden) or not (
            positions.shape == slots.shape == lens.shape == (tokens,)
            and tables.dim() == 2
            and tables.shape[0] == tokens
        ):
            raise ValueError(
                f"decode step: {tokens} tokens of hidden {tuple(hidden.shape)} with positions"
                f" {tuple(positions.shape)}, slots {tuple(slots.shape)}, context lengths"
                f" {tuple(lens.shape)} and block tables {tuple(tables.shape)}"
            )
        hidden, out = hidden.contiguous(), torch.empty_like(hidden)
        scratch = self._scratch(tokens)
        status = self.library.decode_step(
            self.address, hidden.data_ptr(), tokens, positions.data_ptr(), slots.data_ptr(),
            tables.data_ptr(), tables.shape[1], lens.data_ptr(), scratch.data_ptr(),
            scratch.numel(), out.data_ptr(),
        )  # fmt: skip
        if status == _NO_MEMORY:
            raise MemoryError("decode step: a kernel could not allocate its buffer")
        if status:
            raise ValueError(f"decode step: {FAILURES.get(status, f'status {status}')}")
        return out

    def _scratch(self, tokens: int) -> torch.Tensor:
        """A reused buffer: a fresh one each step would cost page faults on the CPU (as the
        dequantizing path's scratch notes). Steps of one model never overlap: they share
        its KV cache."""
        needed = self.library.decode_step_scratch(self.address, tokens)
        if self.scratch.numel() < needed:
            self.scratch = torch.empty(needed)
        return self.scratch

    def _layer(self, model: torch.nn.Module, index: int) -> _Layer:
        layer = model.layers[index]
        attention = layer.self_attn
        cos, sin = model.rope_of(index)
        has_qk_norm = attention.q_norm is not None and attention.k_norm is not None
        return _Layer(
            **{name: self._projection(projection) for name, projection in
               zip(PROJECTIONS, _projections(layer), strict=True)},
            input_norm=self._pointer(layer.input_layernorm.weight),
            post_norm=self._pointer(layer.post_attention_layernorm.weight),
            q_norm=self._pointer(attention.q_norm.weight) if has_qk_norm else None,
            k_norm=self._pointer(attention.k_norm.weight) if has_qk_norm else None,
            cos=self._pointer(cos), sin=self._pointer(sin),
            max_positions=cos.shape[0], rotary_dim=cos.shape[1],
            window=attention.window or 0, input_eps=layer.input_layernorm.eps,
            post_eps=layer.post_attention_layernorm.eps,
            qk_eps=attention.q_norm.eps if has_qk_norm else 0.0,
            scale=attention.scale, softcap=attention.softcap or 0.0,
        )  # fmt: skip

    def _projection(self, linear: QuantizedLinear) -> _Projection:
        packed = linear.packed
        assert packed is not None, "described only when every projection is packed"
        return _Projection(
            mode=packed.mode, n=packed.n, k=packed.k, codes=self._pointer(packed.codes),
            scales=self._pointer(packed.scales),
            lows=self._pointer(packed.lows) if packed.lows is not None else None,
            bias=self._pointer(linear.bias) if linear.bias is not None else None,
        )  # fmt: skip

    def _pointer(self, tensor: torch.Tensor) -> int:
        self.tensors.append(tensor)
        return tensor.data_ptr()


# Each model's description (or why it has none), made at its first decode-only step.
_described: weakref.WeakKeyDictionary[torch.nn.Module, DecodeStep | str] = (
    weakref.WeakKeyDictionary()
)


def native_step(
    model: torch.nn.Module,
    hidden: torch.Tensor,
    meta: object,
    kv_caches: list[KVCache] | None,
) -> DecodeStep | None:
    """The native step to run this step with, its caches attached; None where the modules
    must (see the module's note)."""
    if not (
        isinstance(meta, PagedAttentionMetadata)
        and meta.num_prefill_seqs == 0
        and kv_caches
        and hidden.dtype == torch.float32
        and hidden.device.type == "cpu"
        and dispatch.kernel_backend() == "auto"
    ):
        return None
    step = _described.get(model)
    if step is None:
        step = _described[model] = describe(model)
    return step if isinstance(step, DecodeStep) and step.attach(kv_caches) else None


def describe(model: torch.nn.Module) -> DecodeStep | str:
    """The model described to C, or why it cannot be."""
    why = available() or _why_not(model, quantized.reads())
    return why if why is not None else DecodeStep(model, _library(), quantized._library())


def _why_not(model: torch.nn.Module, layout: tuple[int, bool]) -> str | None:
    if not model.layers:
        return "the model has no decoder layers"
    first = model.layers[0]
    for index, layer in enumerate(model.layers):
        if not getattr(layer, "plain_pre_norm", False):
            return f"layer {index} is a {type(layer).__name__}, not a plain Llama block"
        attention, mlp = layer.self_attn, layer.mlp
        if type(mlp) is not SwiGLUMLP or mlp.activation != "silu":
            return f"layer {index}'s MLP is not SiLU-gated"
        if attention.tp.size != 1 or mlp.tp.size != 1:
            return "the model is split over ranks"
        if any(not _packed(linear, layout) for linear in _projections(layer)):
            return f"layer {index} has a projection not packed for the CPU quantized matmul"
        if (attention.q_norm is None) != (attention.k_norm is None):
            return f"layer {index} norms only one of its queries and keys"
        sizes = ("num_heads", "num_kv_heads", "head_dim")
        if any(getattr(attention, s) != getattr(first.self_attn, s) for s in sizes) or (
            mlp.intermediate_size != first.mlp.intermediate_size
        ):
            return f"layer {index}'s sizes differ from layer 0's"
        norms = [layer.input_layernorm, layer.post_attention_layernorm, attention.q_norm,
                 attention.k_norm]  # fmt: skip
        tables = model.rope_of(index)
        if not all(_plain_norm(n) for n in norms if n is not None) or not all(
            _plain(t) for t in tables
        ):
            return f"layer {index}'s norms or rotary tables are not plain float32 CPU tensors"
    return None if _plain_norm(model.norm) else "the final norm is not plain"


def _projections(layer: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    attention, mlp = layer.self_attn, layer.mlp
    return attention.qkv_proj, attention.o_proj, mlp.gate_up_proj, mlp.down_proj


def _packed(linear: torch.nn.Module, layout: tuple[int, bool]) -> bool:
    """A quantized projection packed for the loaded kernel's (strip, vnni) `layout` (as
    `cpu_quantized_matmul.matmul` checks it), with a float32 bias if any."""
    if not isinstance(linear, QuantizedLinear) or linear.packed is None:
        return False
    return quantized.layout(linear.packed) == layout and (
        linear.bias is None or _plain(linear.bias)
    )


def _plain_norm(norm: RMSNorm) -> bool:
    """A norm whose weight multiplies as it is (Gemma's offset unfolded would not)."""
    return isinstance(norm, RMSNorm) and not norm.offset and _plain(norm.weight)


def _plain(tensor: torch.Tensor) -> bool:
    return tensor.dtype == torch.float32 and tensor.device.type == "cpu" and tensor.is_contiguous()


def _alike(cache: torch.Tensor, first: torch.Tensor) -> bool:
    """Shaped and typed as the first layer's cache, and contiguous (the C side's layout)."""
    return cache.shape == first.shape and cache.dtype == first.dtype and cache.is_contiguous()


def _as(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype).contiguous()
