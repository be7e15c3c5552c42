"""The engine's GPU kernels on a CUDA device: right first, then fast, against measured ceilings.

    .venv/bin/python -m bench.kernels_gpu [--json] [--sections ceilings,correctness,...]
    .venv/bin/python -m bench.kernels_gpu --dry-run   # CPU, Triton's interpreter, tiny shapes

Sections, each guarded (an error is printed and recorded, and the next section runs):

- ceilings: a large device-to-device copy (bytes read + written per second) and a large bf16
  matmul (FLOP/s), measured in this run;
- correctness: every Triton kernel against its torch reference on fresh random inputs, in bf16,
  fp16 and fp32, with outputs poisoned (NaN) beforehand, ragged lengths and block edges;
- parity: the engine's greedy tokens on the Triton path (decode through CUDA graphs on a GPU)
  against its torch path and transformers, for a small random Llama in fp32 and bf16;
- kernels: each kernel timed with CUDA events after warm-up (median, L2 flushed between runs),
  achieved GB/s or TFLOP/s and the fraction of the ceiling; decode attention over batch x
  context, with the target line: batch 64, 4k context, at least 70% of the copy bandwidth;
- tuning: variants of the attention launches (tile sizes, warps, stages, split counts), each
  timed and checked against the reference, so one GPU run says what the launchers should pick;
- decode_step: a Llama-3-8B-shaped decode step built from the dispatch calls (4 layers), at
  batch 1, 16, 64 and 256, eager and replayed from CUDA graphs (kernels/cuda_graphs.py);
- engine: the engine's ModelRunner on a random ~165M-parameter Llama: its decode step
  (`execute`), and its model's decode forward eager and through CUDA graphs;
- memory_budget: the engine's memory budget on the card as its loader computes it (the device
  plugin's share or the whole card, times the default utilisation) for a model of
  SmolLM2-135M's shape (random weights): weights, measured activation peaks, the KV cache the
  rest holds, what the device reports allocated and free once the runner is loaded, and what
  the process holds outside torch (and how the runner measured it).

It runs from the repository root with whatever Python is there (the project needs no install)
and prints first the versions it found ("missing" for what is not installed). Without torch
or CUDA (and without --dry-run) it says so and exits 2; when a section fails it exits 1. With
--json the tables go to stderr and one JSON document to stdout. Timings are printed, never
asserted. The parity, engine and memory_budget sections need transformers (and safetensors).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.nvml_probe import print_versions
from bench.sections import add_sections_flag, chosen_sections

if __name__ == "__main__":  # the versions first, even where torch is missing
    print_versions(file=sys.stderr if "--json" in sys.argv else sys.stdout)
    if importlib.util.find_spec("torch") is None:
        print("torch is missing: the GPU kernel benchmark cannot run", file=sys.stderr)
        sys.exit(2)

import torch

SECTIONS = ("ceilings", "correctness", "parity", "kernels", "tuning", "decode_step", "engine",
            "memory_budget")  # fmt: skip
DECODE_TARGET = {"batch": 64, "context": 4096, "fraction": 0.70}
TOLERANCE = {  # (elementwise, attention): fp16 and fp32 as usual, bf16 a few ulps
    torch.float32: (1e-5, 1e-4),
    torch.float16: (2e-3, 4e-3),
    torch.bfloat16: (2e-2, 3e-2),
}
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True)
class Sizes:
    """Problem sizes: Llama-3-8B's layer shapes on a GPU, toy ones for the CPU dry run."""

    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    block_size: int = 16
    tokens: int = 16384  # elementwise kernels: several times the L2 (60 MB on an H200)
    decode_batches: tuple[int, ...] = (1, 16, 64, 256)
    decode_contexts: tuple[int, ...] = (1024, 4096)
    # (query_len, context_len) chunks per launch: fresh 2k prompts; 2k chunks after 6k cached
    prefill_groups: tuple[tuple[tuple[int, int], ...], ...] = (
        ((2048, 2048),) * 8,
        ((2048, 8192),) * 2,
    )
    step_layers: int = 4
    step_context: int = 1024
    copy_bytes: int = 2 << 30
    matmul: int = 8192
    check_context: int = 1 << 20  # correctness cases' contexts are cut to this
    engine_model: dict = field(
        default_factory=lambda: dict(
            hidden_size=1024,
            intermediate_size=4096,
            num_hidden_layers=8,
            num_attention_heads=16,
            num_key_value_heads=4,
            vocab_size=32000,
            max_position_embeddings=4096,
        )
    )
    engine_context: int = 1024
    budget_model: dict = field(default_factory=lambda: dict(SMOLLM2_135M))
    budget_card_bytes: int | None = None  # None: the card's own size


# SmolLM2-135M-Instruct's shape (its config.json): what the memory budget is shown for.
SMOLLM2_135M = dict(
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    max_position_embeddings=8192,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)


DRY_RUN_SIZES = Sizes(
    hidden=64,
    heads=4,
    kv_heads=2,
    head_dim=16,
    intermediate=96,
    block_size=16,
    tokens=8,
    decode_batches=(1, 3),
    decode_contexts=(40,),
    prefill_groups=(((20, 20), (5, 37)),),
    step_layers=1,
    step_context=20,
    copy_bytes=1 << 20,
    matmul=64,
    check_context=70,
    engine_model=dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=128,
    ),
    engine_context=20,
    budget_model=dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    ),
    budget_card_bytes=64 << 20,  # a pretend card: the GPU arithmetic, run on the CPU
)


# ----------------------------------------------------------------------------- measuring


class Clock:
    """Median time of a call: CUDA events on a GPU (L2 flushed before each run unless told
    not to), the wall clock in a dry run."""

    def __init__(self, device: torch.device, warmup: int = 3, reps: int = 20) -> None:
        self.device, self.warmup, self.reps = device, warmup, reps
        self.cuda = device.type == "cuda"
        self.flush = torch.empty(256 << 20 if self.cuda else 1, dtype=torch.uint8, device=device)

    def median_ms(self, fn: Callable[[], Any], flush: bool = True) -> float:
        for _ in range(self.warmup):
            fn()
        if not self.cuda:
            return self._wall_ms(fn)
        torch.cuda.synchronize(self.device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.reps)]  # fmt: skip
        for start, end in events:
            if flush:
                self.flush.zero_()
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(self.device)
        return statistics.median(start.elapsed_time(end) for start, end in events)

    def _wall_ms(self, fn: Callable[[], Any]) -> float:
        times = []
        for _ in range(min(self.reps, 3)):
            began = time.perf_counter()
            fn()
            times.append((time.perf_counter() - began) * 1e3)
        return statistics.median(times)


class Report:
    """Rows per section, printed as they come (to stderr with --json), and errors per section."""

    def __init__(self, as_json: bool) -> None:
        self.data: dict[str, Any] = {"errors": {}}
        self.out = sys.stderr if as_json else sys.stdout

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def row(self, section: str, row: dict[str, Any], fmt: str) -> None:
        self.data.setdefault(section, []).append(row)
        self.say(fmt.format(**row))

    @contextlib.contextmanager
    def section(self, name: str, title: str) -> Iterator[None]:
        self.say(f"\n== {title}")
        try:
            yield
        except Exception as error:  # one broken section must not cost the rest of the run
            self.data["errors"][name] = f"{type(error).__name__}: {error}"
            self.say(f"!! section {name} failed: {type(error).__name__}: {error}")
            self.say("".join(traceback.format_exception(error)[-6:]))
        finally:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- inputs


@dataclass
class Paged:
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    context_lens: torch.Tensor

    def kv_bytes(self) -> int:
        per_token = self.k_cache.shape[2] * self.k_cache.shape[3] * self.k_cache.element_size()
        return 2 * int(self.context_lens.sum()) * per_token


def paged_cache(lens: list[int], s: Sizes, dtype: torch.dtype, device, poison: bool) -> Paged:
    """Contexts in randomly scattered blocks; every slot outside a context NaN when poisoned."""
    bs = s.block_size
    needed = [-(-n // bs) for n in lens]
    num_blocks = sum(needed) + 2
    order = torch.randperm(num_blocks, device=device).to(torch.int32)
    tables = torch.full((len(lens), max(needed) + 1), -1, dtype=torch.int32, device=device)
    start = 0
    for seq, count in enumerate(needed):
        tables[seq, :count] = order[start : start + count]
        start += count
    shape = (num_blocks, bs, s.kv_heads, s.head_dim)
    k, v = (torch.randn(shape, device=device).to(dtype) for _ in range(2))
    context_lens = torch.tensor(lens, dtype=torch.int32, device=device)
    if poison:
        positions = torch.arange(max(lens), device=device)
        used = positions[None, :] < context_lens[:, None]
        blocks = tables[:, positions // bs].long()
        slots = (blocks * bs + positions % bs)[used]
        keep = torch.zeros(num_blocks * bs, dtype=torch.bool, device=device)
        keep[slots] = True
        for cache in (k, v):
            cache.view(num_blocks * bs, -1)[~keep] = float("nan")
    return Paged(k, v, tables, context_lens)


def randn(*shape: int, dtype: torch.dtype, device) -> torch.Tensor:
    return torch.randn(shape, device=device).to(dtype)


def nan_like(t: torch.Tensor) -> torch.Tensor:
    return torch.full_like(t, float("nan"))


def rope_tables(max_pos: int, dim: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv_freq = 1.0 / (500000 ** (torch.arange(0, dim, 2, device=device).float() / dim))
    angles = torch.arange(max_pos, device=device).float()[:, None] * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


def cu_seqlens(query_lens: list[int], device) -> torch.Tensor:
    cu = torch.zeros(len(query_lens) + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.tensor(query_lens, device=device).cumsum(0)
    return cu


# ----------------------------------------------------------------------------- ceilings


def ceilings(report: Report, clock: Clock, s: Sizes) -> None:
    device = clock.device
    src = torch.empty(s.copy_bytes, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    ms = clock.median_ms(lambda: dst.copy_(src), flush=False)
    copy_gbs = 2 * s.copy_bytes / ms / 1e6
    a, b = (randn(s.matmul, s.matmul, dtype=torch.bfloat16, device=device) for _ in range(2))
    ms_mm = clock.median_ms(lambda: a @ b, flush=False)
    tflops = 2 * s.matmul**3 / ms_mm / 1e9
    report.data["ceilings"] = {"copy_GBps": copy_gbs, "bf16_matmul_TFLOPs": tflops}
    report.say(f"copy (read+write): {copy_gbs:,.0f} GB/s")
    report.say(f"bf16 matmul {s.matmul}^3: {tflops:,.1f} TFLOP/s")


# ----------------------------------------------------------------------------- correctness


def correctness_cases(s: Sizes, dtype: torch.dtype, device) -> Iterator[tuple[str, Callable]]:
    """(name, run) pairs; run() -> (triton output, reference output) on fresh inputs."""
    from batching_engine.kernels import decode_attention as da
    from batching_engine.kernels import kv_cache_write as kw
    from batching_engine.kernels import prefill_attention as pa
    from batching_engine.kernels import rmsnorm as rn
    from batching_engine.kernels import rotary as ro
    from batching_engine.kernels import silu_and_mul as sm

    t, h, cut = 37, s.hidden, s.check_context

    def rmsnorm():
        x, r = (randn(t, h, dtype=dtype, device=device) for _ in range(2))
        w = randn(h, dtype=dtype, device=device)
        got = rn.fused_add_rmsnorm_triton(x, r, w, 1e-5, nan_like(x), nan_like(x))
        return torch.cat(got), torch.cat(rn.fused_add_rmsnorm_reference(x, r, w, 1e-5))

    def silu():
        x = randn(t, 2 * s.intermediate, dtype=dtype, device=device)
        out = torch.full((t, s.intermediate), float("nan"), dtype=dtype, device=device)
        return sm.silu_and_mul_triton(x, out), sm.silu_and_mul_reference(x)

    def rotary():
        q = randn(t, s.heads, s.head_dim, dtype=dtype, device=device)
        k = randn(t, s.kv_heads, s.head_dim, dtype=dtype, device=device)
        cos, sin = rope_tables(8192, s.head_dim, device)
        pos = torch.randint(0, 8192, (t,), device=device)
        got = ro.rotary_embedding_triton(pos, q, k, cos, sin, nan_like(q), nan_like(k))
        want = ro.rotary_embedding_reference(pos, q, k, cos, sin)
        return torch.cat([g.flatten() for g in got]), torch.cat([w.flatten() for w in want])

    def kv_write():
        paged = paged_cache([64] * 4, s, dtype, device, poison=False)
        caches = [nan_like(paged.k_cache) for _ in range(4)]
        key, value = (
            randn(t, s.kv_heads, s.head_dim, dtype=dtype, device=device) for _ in range(2)
        )
        slots = torch.randperm(paged.k_cache.shape[0] * s.block_size, device=device)[:t]
        slots[::5] = -1
        kw.write_kv_cache_triton(key, value, caches[0], caches[1], slots)
        kw.write_kv_cache_reference(key, value, caches[2], caches[3], slots)
        got, want = torch.cat(caches[:2]), torch.cat(caches[2:])
        same_nan = torch.equal(got.isnan(), want.isnan())
        return got.nan_to_num(0.0 if same_nan else 1e9), want.nan_to_num(0.0)

    def decode(num_splits):
        lens = [min(n, cut) for n in (1, 15, 16, 17, 1000, 3000, 0, 257)]
        paged = paged_cache([max(n, 1) for n in lens], s, dtype, device, poison=True)
        paged.context_lens[6] = 0  # a padded CUDA-graph row
        q = randn(len(lens), s.heads, s.head_dim, dtype=dtype, device=device)
        args = (q, paged.k_cache, paged.v_cache, paged.block_tables, paged.context_lens)
        got = da.decode_attention_triton(*args, out=nan_like(q), num_splits=num_splits)
        return got, da.decode_attention_reference(*args)

    def prefill():
        chunks = [(300, 300), (64, 1000), (1, 17), (129, 129), (77, 2100)]
        chunks = [(min(n, cut), min(c, cut)) for n, c in chunks]
        paged = paged_cache([c for _, c in chunks], s, dtype, device, poison=True)
        q = randn(sum(n for n, _ in chunks), s.heads, s.head_dim, dtype=dtype, device=device)
        cu = cu_seqlens([n for n, _ in chunks], device)
        args = (q, paged.k_cache, paged.v_cache, paged.block_tables, paged.context_lens, cu)
        got = pa.prefill_attention_triton(*args, out=nan_like(q))
        return got, pa.prefill_attention_reference(*args)

    yield "fused_add_rmsnorm", rmsnorm
    yield "silu_and_mul", silu
    yield "rotary", rotary
    yield "kv_cache_write", kv_write
    yield "decode_attention/no-split", lambda: decode(1)
    yield "decode_attention/split-8", lambda: decode(8)
    yield "decode_attention/heuristic", lambda: decode(None)
    yield "prefill_attention", prefill


def correctness(report: Report, clock: Clock, s: Sizes) -> None:
    device = clock.device
    fmt = "{kernel:<28} {dtype:<5} max|err| {max_abs_err:.2e}  tol {tol:.0e} abs+rel  {verdict}"
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for name, run in correctness_cases(s, dtype, device):
            tol = TOLERANCE[dtype][1 if "attention" in name else 0]
            try:
                got, want = run()
                err = (got.float() - want.float()).abs()
                max_err = float(err.nan_to_num(float("inf")).max())
                ok = bool(torch.allclose(got.float(), want.float(), atol=tol, rtol=tol))
                verdict = "ok" if ok else "MISMATCH"
            except Exception as error:  # keep checking the other kernels
                max_err, verdict = float("nan"), f"ERROR {type(error).__name__}: {error}"
            row = {"kernel": name, "dtype": DTYPE_NAMES[dtype], "max_abs_err": max_err,
                   "tol": tol, "verdict": verdict}  # fmt: skip
            report.row("correctness", row, fmt)


# ----------------------------------------------------------------------------- parity

PARITY_PROMPT_LENGTHS = (3, 21, 9, 30)
PARITY_TOKENS = 8


def parity(report: Report, clock: Clock, s: Sizes) -> None:
    """Greedy tokens of the engine's ModelRunner, all prompts decoded together with prompts cut
    into 16-token chunks, on each kernel path; transformers on the CPU in fp32 is the reference.
    The model is the tests' tiny Llama (peaked logits, llama3 rope scaling)."""
    from batching_engine.kernels import dispatch
    from batching_engine.model_runner import ModelRunner
    from harness.tiny_llama import (
        LLAMA3_ROPE,
        hf_greedy,
        runner_greedy,
        save_tiny_llama,
    )

    fmt = "{dtype:<5} {path:<7} graphs {graphs!s:<5} tokens {tokens}  {verdict}"
    generator = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=generator).tolist()
               for n in PARITY_PROMPT_LENGTHS]  # fmt: skip
    before = dispatch.kernel_backend()
    with tempfile.TemporaryDirectory() as folder:
        reference = save_tiny_llama(Path(folder), rope_scaling=LLAMA3_ROPE)
        expected = [hf_greedy(reference, prompt, PARITY_TOKENS) for prompt in prompts]
        try:
            for dtype in (torch.float32, torch.bfloat16):
                paths = {}
                for path in ("torch", "triton"):
                    dispatch.set_kernel_backend(path)
                    runner = ModelRunner(
                        folder, device=str(clock.device), dtype=dtype, max_model_len=64,
                        kv_cache_memory_bytes=64 * 8192, max_num_seqs=len(prompts),
                    )  # fmt: skip
                    if path == "triton" and not clock.cuda:  # a GPU runner captured its own
                        runner.capture_decode_graphs(replay_stand_in)
                    tokens = runner_greedy(runner, prompts, PARITY_TOKENS, chunk_size=16)
                    paths[path] = tokens
                    against = "transformers" if path == "torch" else "torch path"
                    want = expected if path == "torch" else paths["torch"]
                    matching = sum(a == b for got, ref in zip(tokens, want, strict=True)
                                   for a, b in zip(got, ref, strict=True))  # fmt: skip
                    total = len(prompts) * PARITY_TOKENS
                    same = tokens == want
                    row = {"dtype": DTYPE_NAMES[dtype], "path": path,
                           "graphs": runner.decode_graphs is not None, "tokens": total,
                           "against": against, "matching": matching, "same": same,
                           "verdict": f"{'same as' if same else 'DIFFERS from'} the {against}"
                                      f" ({matching}/{total})"}  # fmt: skip
                    report.row("parity", row, fmt)
                    del runner
        finally:
            dispatch.set_kernel_backend(before)


# ----------------------------------------------------------------------------- kernels


def kernel_timings(report: Report, clock: Clock, s: Sizes) -> None:
    from batching_engine.kernels import dispatch

    device, dtype = clock.device, torch.bfloat16
    ceil = report.data.get("ceilings", {})
    fmt = "{kernel:<22} {shape:<34} {ms:9.4f} ms  {rate:>10}  {fraction}"

    def add(kernel, shape, ms, bytes_=None, flops=None):
        if bytes_ is not None:
            value, ceiling, unit = bytes_ / ms / 1e6, ceil.get("copy_GBps"), "GB/s"
        else:
            value, ceiling, unit = flops / ms / 1e9, ceil.get("bf16_matmul_TFLOPs"), "TFLOP/s"
        against = "copy" if unit == "GB/s" else "matmul"
        fraction = f"{value / ceiling:6.1%} of {against}" if ceiling else ""
        row = {"kernel": kernel, "shape": shape, "ms": ms, "rate": f"{value:,.1f} {unit}",
               "value": value, "unit": unit, "fraction": fraction,
               "fraction_of_ceiling": value / ceiling if ceiling else None}  # fmt: skip
        report.row("kernels", row, fmt)
        return row

    es, t, h = 2, s.tokens, s.hidden
    x, r = (randn(t, h, dtype=dtype, device=device) for _ in range(2))
    w = randn(h, dtype=dtype, device=device)
    ms = clock.median_ms(lambda: dispatch.fused_add_rmsnorm(x, r, w, 1e-5))
    add("fused_add_rmsnorm", f"{t}x{h}", ms, bytes_=4 * t * h * es)
    gate_up = randn(t // 4, 2 * s.intermediate, dtype=dtype, device=device)
    ms = clock.median_ms(lambda: dispatch.silu_and_mul(gate_up))
    add("silu_and_mul", f"{t // 4}x{2 * s.intermediate}", ms, bytes_=3 * gate_up.numel() // 2 * es)
    q = randn(t, s.heads, s.head_dim, dtype=dtype, device=device)
    k = randn(t, s.kv_heads, s.head_dim, dtype=dtype, device=device)
    cos, sin = rope_tables(8192, s.head_dim, device)
    pos = torch.randint(0, 8192, (t,), device=device)
    ms = clock.median_ms(lambda: dispatch.rotary_embedding(pos, q, k, cos, sin))
    moved = 2 * (q.numel() + k.numel()) * es + 2 * t * s.head_dim * 4
    add("rotary", f"{t} tok, {s.heads}+{s.kv_heads} heads", ms, bytes_=moved)
    paged = paged_cache([t // 8] * 8 + [s.block_size], s, dtype, device, poison=False)
    slots = torch.randperm(paged.k_cache.shape[0] * s.block_size, device=device)[:t]
    value = torch.randn_like(k)
    ms = clock.median_ms(
        lambda: dispatch.write_kv_cache(k, value, paged.k_cache, paged.v_cache, slots)
    )
    add("kv_cache_write", f"{t} tok, {s.kv_heads} kv heads", ms, bytes_=4 * k.numel() * es)
    decode_sweep(report, clock, s, add)
    prefill_timing(clock, s, add)


def decode_sweep(report: Report, clock: Clock, s: Sizes, add) -> None:
    from batching_engine.kernels import dispatch

    device, dtype = clock.device, torch.bfloat16
    for context in s.decode_contexts:
        for batch in s.decode_batches:
            paged = paged_cache([context] * batch, s, dtype, device, poison=False)
            q = randn(batch, s.heads, s.head_dim, dtype=dtype, device=device)
            args = (q, paged.k_cache, paged.v_cache, paged.block_tables, paged.context_lens)
            ms = clock.median_ms(lambda args=args: dispatch.decode_attention(*args))
            moved = paged.kv_bytes() + 2 * q.numel() * q.element_size()
            row = add("decode_attention", f"batch {batch}, context {context}", ms, bytes_=moved)
            if batch == DECODE_TARGET["batch"] and context == DECODE_TARGET["context"]:
                fraction = row["fraction_of_ceiling"]
                met = fraction is not None and fraction >= DECODE_TARGET["fraction"]
                report.data["decode_target"] = {**DECODE_TARGET, "achieved": fraction, "met": met}
                report.say(f"   -> target: >= {DECODE_TARGET['fraction']:.0%} of copy bandwidth: "
                           f"{'MET' if met else 'MISSED'}")  # fmt: skip
            del paged, q, args


def prefill_timing(clock: Clock, s: Sizes, add) -> None:
    from batching_engine.kernels import dispatch

    device, dtype = clock.device, torch.bfloat16
    for chunks in s.prefill_groups:
        paged = paged_cache([c for _, c in chunks], s, dtype, device, poison=False)
        query_lens = [n for n, _ in chunks]
        q = randn(sum(query_lens), s.heads, s.head_dim, dtype=dtype, device=device)
        cu = cu_seqlens(query_lens, device)
        args = (q, paged.k_cache, paged.v_cache, paged.block_tables, paged.context_lens, cu)
        longest = max(query_lens)
        ms = clock.median_ms(
            lambda args=args, longest=longest: dispatch.prefill_attention(
                *args, max_query_len=longest
            )
        )
        pairs = sum(n * (c - n) + n * (n + 1) // 2 for n, c in chunks)
        shape = f"{len(chunks)} x ({chunks[0][0]} q over {chunks[0][1]} ctx)"
        add("prefill_attention", shape, ms, flops=4 * pairs * s.heads * s.head_dim)
        del paged, q, args


# ----------------------------------------------------------------------------- tuning


def decode_variants(s: Sizes, dry_run: bool) -> list[tuple[int | None, int, int, int]]:
    """(num_splits, BLOCK_N, num_warps, num_stages): the launcher's config first (None splits:
    its heuristic), then tiles x warps x stages at the heuristic, then other split counts."""
    if dry_run:
        return [(None, 16, 4, 2), (2, 32, 4, 2)]
    tiles = [(None, n, w, st) for n in (32, 64, 128) for w in (4, 8) for st in (2, 3)]
    return (
        [(None, 64, 4, 2)]
        + [v for v in tiles if v != (None, 64, 4, 2)]
        + [(n, 64, 4, 2) for n in (1, 2, 4, 8)]
    )


TUNING_FMT = "{kernel:<8} {config:<42} {ms:9.4f} ms  {rate:>16}  max|err| {err:.1e}  {note}"


def tuning(report: Report, clock: Clock, s: Sizes) -> None:
    """Launch variants of decode and prefill attention, timed and checked, so one GPU run says
    which configuration the launchers should pick."""
    decode_tuning(report, clock, s)
    prefill_tuning(report, clock, s)


def tuning_row(report: Report, kernel: str, config: str, measure: Callable) -> None:
    """measure() -> (ms, rate text, max error, extra fields); a variant that fails is a row."""
    try:
        ms, rate, err, extra = measure()
        row = {"kernel": kernel, "config": config, "ms": ms, "rate": rate, "err": err,
               "note": "", **extra}  # fmt: skip
    except Exception as error:  # a variant the GPU refuses must not end the sweep
        note = f"ERROR {type(error).__name__}: {error}"[:200]
        row = {"kernel": kernel, "config": config, "ms": float("nan"), "rate": "-",
               "err": float("nan"), "note": note}  # fmt: skip
    report.row("tuning", row, TUNING_FMT)


def decode_tuning(report: Report, clock: Clock, s: Sizes) -> None:
    import dataclasses

    from batching_engine.kernels import decode_attention as da

    device, dtype, interpreted = clock.device, torch.bfloat16, not clock.cuda
    copy = report.data.get("ceilings", {}).get("copy_GBps")
    batch, context = (DECODE_TARGET["batch"], DECODE_TARGET["context"]) if clock.cuda else (3, 40)
    paged = paged_cache([context] * batch, s, dtype, device, poison=False)
    q = randn(batch, s.heads, s.head_dim, dtype=dtype, device=device)
    args = (q, paged.k_cache, paged.v_cache, paged.block_tables, paged.context_lens)
    want = da.decode_attention_reference(*args).float()
    moved = paged.kv_bytes() + 2 * q.numel() * q.element_size()
    heuristic = da.choose_num_splits(
        batch, s.kv_heads, paged.block_tables.shape[1] * s.block_size, _sms(device)
    )
    for splits, block_n, warps, stages in decode_variants(s, interpreted):
        splits = splits or heuristic

        def measure(splits=splits, block_n=block_n, warps=warps, stages=stages):
            out = torch.empty_like(q)
            attention, merge = da.decode_attention_plan(
                *args[:5], out, q.shape[-1] ** -0.5, splits, interpreted=interpreted
            )
            attention = dataclasses.replace(
                attention, constexprs={**attention.constexprs, "BLOCK_N": block_n},
                num_warps=warps, num_stages=stages,
            )  # fmt: skip

            def run():
                attention.run(da._decode_attention_kernel)
                if merge is not None:
                    merge.run(da._decode_reduce_kernel)

            ms = clock.median_ms(run)
            gbs = moved / ms / 1e6
            rate = f"{gbs:,.0f} GB/s" + (f" {gbs / copy:4.0%}" if copy else "")
            return ms, rate, float((out.float() - want).abs().max()), {"GBps": gbs}

        config = f"splits {splits:>2} BLOCK_N {block_n:>3} warps {warps} stages {stages}"
        tuning_row(report, "decode", config, measure)


def prefill_tuning(report: Report, clock: Clock, s: Sizes) -> None:
    import dataclasses

    import triton

    from batching_engine.kernels import prefill_attention as pa

    device, dtype, interpreted = clock.device, torch.bfloat16, not clock.cuda
    chunks = s.prefill_groups[0]
    paged = paged_cache([c for _, c in chunks], s, dtype, device, poison=False)
    query_lens = [n for n, _ in chunks]
    q = randn(sum(query_lens), s.heads, s.head_dim, dtype=dtype, device=device)
    cu = cu_seqlens(query_lens, device)
    args = (q, paged.k_cache, paged.v_cache, paged.block_tables, paged.context_lens, cu)
    want = pa.prefill_attention_reference(*args).float()
    flops = 4 * sum(n * (c - n) + n * (n + 1) // 2 for n, c in chunks) * s.heads * s.head_dim
    variants = [(64, 64, 8, 2), (128, 64, 8, 2), (128, 32, 4, 3), (64, 64, 4, 3), (128, 64, 8, 3)]
    for block_m, block_n, warps, stages in variants[:2] if interpreted else variants:
        block_m = 16 if interpreted else block_m

        def measure(block_m=block_m, block_n=block_n, warps=warps, stages=stages):
            out = torch.empty_like(q)
            plan = pa.prefill_attention_plan(
                *args, out, q.shape[-1] ** -0.5, max(query_lens), interpreted=interpreted
            )
            plan = dataclasses.replace(
                plan, grid=(triton.cdiv(max(query_lens), block_m), *plan.grid[1:]),
                constexprs={**plan.constexprs, "BLOCK_M": block_m, "BLOCK_N": block_n},
                num_warps=warps, num_stages=stages,
            )  # fmt: skip
            ms = clock.median_ms(lambda: plan.run(pa._prefill_attention_kernel))
            tflops = flops / ms / 1e9
            err = float((out.float() - want).abs().max())
            return ms, f"{tflops:,.1f} TFLOP/s", err, {"TFLOPs": tflops}

        config = f"BLOCK_M {block_m:>3} BLOCK_N {block_n:>3} warps {warps} stages {stages}"
        tuning_row(report, "prefill", config, measure)


def _sms(device: torch.device) -> int:
    from batching_engine.kernels._launch import sm_count

    return sm_count(device)


# ----------------------------------------------------------------------------- decode step


class SyntheticDecoder:
    """Llama-3-8B-shaped decode layers from the dispatch calls and torch matmuls: what the
    kernels and CUDA graphs give a decode step, independent of the engine's model code."""

    def __init__(self, s: Sizes, max_batch: int, device, dtype=torch.bfloat16) -> None:
        self.s, self.dtype = s, dtype
        q_size, kv_size = s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.split = [q_size, kv_size, kv_size]

        def weight(*shape):
            return (torch.randn(shape, device=device) * 0.02).to(dtype)

        self.layers = [
            {"qkv": weight(s.hidden, q_size + 2 * kv_size), "o": weight(q_size, s.hidden),
             "gate_up": weight(s.hidden, 2 * s.intermediate),
             "down": weight(s.intermediate, s.hidden),
             "ln1": torch.ones(s.hidden, device=device, dtype=dtype),
             "ln2": torch.ones(s.hidden, device=device, dtype=dtype)}
            for _ in range(s.step_layers)
        ]  # fmt: skip
        self.embed = weight(32000, s.hidden)
        self.final_ln = torch.ones(s.hidden, device=device, dtype=dtype)
        self.cos, self.sin = rope_tables(s.step_context + 16, s.head_dim, device)
        blocks = max_batch * (-(-s.step_context // s.block_size)) + 1
        shape = (blocks, s.block_size, s.kv_heads, s.head_dim)
        self.caches = [(weight(*shape), weight(*shape)) for _ in range(s.step_layers)]

    def inputs(self, batch: int, device) -> dict[str, torch.Tensor]:
        s = self.s
        per_seq = -(-s.step_context // s.block_size)
        order = torch.randperm(self.caches[0][0].shape[0], device=device)[: batch * per_seq]
        tables = order.view(batch, per_seq).to(torch.int32)
        last = s.step_context - 1
        slots = tables[:, last // s.block_size].long() * s.block_size + last % s.block_size
        return {
            "input_ids": torch.randint(0, 32000, (batch,), device=device),
            "positions": torch.full((batch,), last, device=device, dtype=torch.int64),
            "slot_mapping": slots,
            "context_lens": torch.full((batch,), s.step_context, device=device, dtype=torch.int32),
            "block_tables": tables,
        }

    def forward(self, input_ids, positions, slot_mapping, context_lens, block_tables):
        from batching_engine.kernels import dispatch

        s, hidden, residual = self.s, self.embed[input_ids], None
        for layer, (k_cache, v_cache) in zip(self.layers, self.caches, strict=True):
            x, residual = dispatch.fused_add_rmsnorm(hidden, residual, layer["ln1"], 1e-5)
            q, k, v = (x @ layer["qkv"]).split(self.split, dim=-1)
            q, k = dispatch.rotary_embedding(
                positions, q.view(-1, s.heads, s.head_dim), k.view(-1, s.kv_heads, s.head_dim),
                self.cos, self.sin,
            )  # fmt: skip
            v = v.view(-1, s.kv_heads, s.head_dim)
            dispatch.write_kv_cache(k, v, k_cache, v_cache, slot_mapping)
            attn = dispatch.decode_attention(q, k_cache, v_cache, block_tables, context_lens)
            hidden = attn.view(attn.shape[0], -1) @ layer["o"]
            x, residual = dispatch.fused_add_rmsnorm(hidden, residual, layer["ln2"], 1e-5)
            hidden = dispatch.silu_and_mul(x @ layer["gate_up"]) @ layer["down"]
        return dispatch.fused_add_rmsnorm(hidden, residual, self.final_ln, 1e-5)[0]


def replay_stand_in(forward, inputs):
    """Dry run only, in place of a CUDA graph: replay recomputes from the same buffers."""
    output = forward(**inputs).clone()
    return (lambda: output.copy_(forward(**inputs))), output


def time_decode_forward(report, clock, section, label, forward, make_inputs, batches) -> None:
    """One row per batch: forward eagerly, then through CUDA graphs captured for `batches`."""
    from batching_engine.kernels.cuda_graphs import DecodeGraphs

    device = clock.device
    fmt = "{model:<30} batch {batch:>4}  eager {eager_ms:8.3f} ms  graphs {graph_ms}  {note}"
    graphs, note = None, "" if clock.cuda else "(dry run: stand-in graphs)"
    if clock.cuda and not DecodeGraphs.available(device):
        note = "no CUDA graphs: the kernels are not on the Triton path"
    else:
        top = make_inputs(max(batches))
        static = {name: torch.zeros_like(t) for name, t in top.items()}
        capture = None if clock.cuda else replay_stand_in
        graphs = DecodeGraphs(forward, static, sorted(batches), capture=capture)
        if not graphs.capture_all():
            graphs, note = None, "capture failed (see the warning above): eager only"
    for batch in batches:
        inputs = make_inputs(batch)
        eager_ms = clock.median_ms(lambda inputs=inputs: forward(**inputs), flush=False)
        graph_ms, row_note = None, note
        if graphs is not None:
            graph_ms = clock.median_ms(lambda inputs=inputs: graphs.run(inputs), flush=False)
            diff = float((graphs.run(inputs).float() - forward(**inputs).float()).abs().max())
            row_note = f"{note} graph vs eager max|diff| {diff:.1e}".strip()
        row = {"model": label, "batch": batch, "eager_ms": eager_ms,
               "graph_ms": f"{graph_ms:8.3f} ms" if graph_ms is not None else "     n/a",
               "graph_ms_value": graph_ms, "tokens_per_s_eager": batch / eager_ms * 1e3,
               "tokens_per_s_graph": batch / graph_ms * 1e3 if graph_ms else None,
               "note": row_note}  # fmt: skip
        report.row(section, row, fmt)


def decode_step(report: Report, clock: Clock, s: Sizes) -> None:
    device = clock.device
    model = SyntheticDecoder(s, max(s.decode_batches), device)
    label = f"synthetic {s.step_layers}-layer, ctx {s.step_context}"
    with torch.inference_mode():
        time_decode_forward(report, clock, "decode_step", label, model.forward,
                            lambda b: model.inputs(b, device), s.decode_batches)  # fmt: skip


# ----------------------------------------------------------------------------- engine


def engine_step(report: Report, clock: Clock, s: Sizes) -> None:
    """The engine's ModelRunner on a random Llama saved on the spot."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from batching_engine.model_runner import ModelRunner
    from batching_engine.sequence import SamplingParams, Sequence

    device = clock.device
    batches = s.decode_batches
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**s.engine_model)).to(torch.bfloat16).save_pretrained(folder)
        per_seq = -(-(s.engine_context + 1) // s.block_size)
        kv_bytes = (max(batches) * per_seq + 1) * engine_bytes_per_block(s)
        runner = ModelRunner(
            folder, device=str(device), dtype="bfloat16", block_size=s.block_size,
            kv_cache_memory_bytes=kv_bytes, max_model_len=s.engine_context + 1,
            max_num_seqs=max(batches), max_num_batched_tokens=max(4096, max(batches)),
        )  # fmt: skip
    fmt = "{model:<30} batch {batch:>4}  execute {ms:8.3f} ms  {tokens_per_s:10,.0f} tok/s"
    for batch in batches:
        seqs = decode_batch(batch, s, per_seq, SamplingParams, Sequence)
        ms = clock.median_ms(lambda seqs=seqs: runner.execute(seqs), flush=False)
        row = {"model": "engine ModelRunner.execute", "batch": batch, "ms": ms,
               "tokens_per_s": batch / ms * 1e3}  # fmt: skip
        report.row("engine", row, fmt)
    forward, make_inputs = engine_forward(runner, s, per_seq)
    with torch.inference_mode():
        time_decode_forward(report, clock, "engine", "engine model forward", forward,
                            make_inputs, batches)  # fmt: skip


def engine_bytes_per_block(s: Sizes) -> int:
    m = s.engine_model
    head_dim = m["hidden_size"] // m["num_attention_heads"]
    per_layer = 2 * s.block_size * m["num_key_value_heads"] * head_dim * 2  # K and V, bf16
    return m["num_hidden_layers"] * per_layer


def decode_batch(batch: int, s: Sizes, per_seq: int, SamplingParams, Sequence) -> list:
    """`batch` sequences one token past an `engine_context`-token prompt, blocks assigned."""
    params = SamplingParams(temperature=0.0, max_tokens=8)
    pairs = []
    for index in range(batch):
        seq = Sequence([(index + i) % 200 + 1 for i in range(s.engine_context)], params)
        seq.output_token_ids.append(7)
        seq.num_computed_tokens = s.engine_context
        seq.block_table = list(range(index * per_seq, (index + 1) * per_seq))
        pairs.append((seq, 1))
    return pairs


def engine_forward(runner, s: Sizes, per_seq: int):
    """The runner's decode step on inputs given as tensors, so CUDA graphs can hold them."""
    device = runner.device
    forward = runner.decode_forward

    def make_inputs(batch: int) -> dict[str, torch.Tensor]:
        tables = torch.arange(batch * per_seq, device=device, dtype=torch.int32)
        tables = tables.view(batch, per_seq)
        last = s.engine_context
        slots = tables[:, last // s.block_size].long() * s.block_size + last % s.block_size
        return {
            "input_ids": torch.full((batch,), 7, device=device, dtype=torch.int64),
            "positions": torch.full((batch,), last, device=device, dtype=torch.int64),
            "slot_mapping": slots,
            "context_lens": torch.full((batch,), last + 1, device=device, dtype=torch.int32),
            "block_tables": tables,
        }

    return forward, make_inputs


# ----------------------------------------------------------------------------- memory budget


def memory_budget(report: Report, clock: Clock, s: Sizes) -> None:
    """What batching_engine.loading does for a generation model, with the engine's default
    settings: the budget, then a ModelRunner that fits weights, activations, the decode graphs'
    pool and the KV cache into it. The dry run resolves a GPU budget for a pretend card and
    hands it to a CPU runner (no activations are measured there)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from batching_engine.config import EngineConfig
    from batching_engine.memory_budget import resolve_memory_budget
    from batching_engine.model_runner import ModelRunner

    device, mib = clock.device, 1 << 20
    engine = EngineConfig()
    card = s.budget_card_bytes
    if card is None:
        card = torch.cuda.get_device_properties(device).total_memory
    budget = resolve_memory_budget(device="cuda", environ=os.environ, device_total_bytes=card)
    report.say(f"budget from {budget.source}: {budget.total_bytes // mib} MiB "
               f"of the card's {card // mib} MiB")  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        torch.manual_seed(0)
        model = LlamaForCausalLM(LlamaConfig(**s.budget_model)).to(torch.bfloat16)
        model.save_pretrained(folder)
        del model
        started = time.perf_counter()
        runner = ModelRunner(
            folder, device=str(device), dtype="bfloat16", block_size=engine.block_size,
            memory_budget_bytes=budget.total_bytes, max_model_len=engine.max_model_len,
            max_num_seqs=engine.max_num_seqs,
            max_num_batched_tokens=engine.max_num_batched_tokens,
        )  # fmt: skip
        load_s = time.perf_counter() - started
    layout = runner.kv_layout
    kv_bytes = runner.num_kv_blocks * layout.bytes_per_block
    row: dict[str, Any] = {
        "model": "SmolLM2-135M shape" if s.budget_model == SMOLLM2_135M else "toy Llama",
        "budget_source": budget.source, "card_MiB": card // mib,
        "budget_MiB": budget.total_bytes // mib, "weights_MiB": runner.weight_bytes // mib,
        "kv_blocks": runner.num_kv_blocks, "block_size": layout.block_size,
        "kv_MiB": kv_bytes // mib, "kv_tokens": runner.num_kv_blocks * layout.block_size,
        "max_model_len": runner.max_model_len, "max_num_seqs": runner.max_num_seqs,
        "decode_graphs": runner.decode_graphs is not None, "load_s": load_s,
    }  # fmt: skip
    report.row("memory_budget", row, "{model}: weights {weights_MiB} MiB (bf16), KV cache "
               "{kv_blocks} blocks of {block_size} tokens = {kv_MiB} MiB ({kv_tokens} tokens),"
               " decode graphs {decode_graphs}, loaded in {load_s:.1f} s")  # fmt: skip
    if clock.cuda:
        peaks = runner._activation_peaks()  # measured again, after the cache: the same steps
        free, _ = torch.cuda.mem_get_info(device)
        _, own = runner.memory_meter.measure(device)
        row |= {"activation_step_MiB": peaks.step // mib,
                "graph_pool_MiB": peaks.decode_forward // mib,
                "allocated_MiB": torch.cuda.memory_allocated(device) // mib,
                "reserved_MiB": torch.cuda.memory_reserved(device) // mib,
                "device_free_MiB": free // mib, "outside_MiB": own.outside_torch // mib,
                "outside_measured_by": own.method}  # fmt: skip
        report.say("activations: step peak {activation_step_MiB} MiB, decode graphs' pool "
                   "{graph_pool_MiB} MiB; torch allocated {allocated_MiB} MiB, reserved "
                   "{reserved_MiB} MiB of the {budget_MiB} MiB budget; device free "
                   "{device_free_MiB} MiB; outside torch {outside_MiB} MiB "
                   "({outside_measured_by})".format(**row))  # fmt: skip
    spare = budget.total_bytes - runner.weight_bytes - kv_bytes
    report.say(f"budget - weights - KV cache = {spare // mib} MiB left for activations and graphs")
    del runner


# ----------------------------------------------------------------------------- main


SECTION_RUNS = {
    "ceilings": ("ceilings: what this GPU moves and multiplies", ceilings),
    "correctness": ("correctness: Triton vs torch reference, poisoned outputs", correctness),
    "parity": ("parity: the engine's greedy tokens, Triton path vs torch path", parity),
    "kernels": ("kernels: median of CUDA-event timings after warm-up", kernel_timings),
    "tuning": ("tuning: launch variants of the attention kernels (bf16)", tuning),
    "decode_step": ("decode step: eager vs CUDA graphs", decode_step),
    "engine": ("engine: ModelRunner decode step", engine_step),
    "memory_budget": ("memory budget: the engine's loader on SmolLM2's shape", memory_budget),
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="JSON to stdout, tables to stderr")
    add_sections_flag(parser, SECTIONS)
    parser.add_argument(
        "--dry-run", action="store_true", help="CPU, Triton's interpreter, toy shapes"
    )
    args = parser.parse_args(argv)
    args.sections = chosen_sections(parser, args, SECTIONS)
    return args


def describe_device(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__,
                            "cuda": torch.version.cuda or "none"}  # fmt: skip
    with contextlib.suppress(Exception):
        import triton

        info["triton"] = triton.__version__
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info |= {"name": props.name, "sms": props.multi_processor_count,
                 "memory_GiB": round(props.total_memory / 2**30, 1),
                 "capability": f"{props.major}.{props.minor}"}  # fmt: skip
    return info


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before anything imports triton
        os.environ.setdefault("INFERGRID_KERNELS", "triton")
        device, sizes = torch.device("cpu"), DRY_RUN_SIZES
    elif torch.cuda.is_available():
        device, sizes = torch.device("cuda"), Sizes()
    else:
        print("no CUDA device: the GPU kernel benchmark did not run (--dry-run checks the "
              "script on CPU)", file=sys.stderr)  # fmt: skip
        return 2
    report = Report(args.json)
    report.data["device"] = describe_device(device)
    report.say(" ".join(f"{k}={v}" for k, v in report.data["device"].items()))
    torch.manual_seed(0)
    # A dry run checks that the script works, not how fast: one warm-up, one timed call.
    clock = Clock(device, warmup=1, reps=1) if args.dry_run else Clock(device)
    for name in args.sections:
        title, run = SECTION_RUNS[name]
        with report.section(name, title):
            run(report, clock, sizes)
    if args.json:
        print(json.dumps(report.data, indent=2, default=str))
    report.say(f"\nsections with errors: {sorted(report.data['errors']) or 'none'}")
    return 1 if report.data["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
