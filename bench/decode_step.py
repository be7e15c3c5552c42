"""One decode step of SmolLM2-135M on the CPU: its 30 layers in one native call
(kernels/cpu_decode_step.c) against module by module (`LlamaModel.run_layers`, every step's
path before it), for int4 and int8 weights at batch 1 and 16.

Each batch is prefilled through the runner, then the same decode step (one token per
sequence, contexts of 41 to 86 tokens) runs again and again, the two paths taking turns so
that both see the same load: the forward pass plus the LM head over its rows, as the runner
runs them. `runner` is a whole `ModelRunner.execute` decode step on the native path
(metadata, forward, head and sampling), advancing one token a step. Prints the median
milliseconds of each, measured in one run.

    .venv/bin/python -m bench.decode_step [--modes int4,int8] [--batches 1,16] [--steps 50]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from batching_engine.kernels import cpu_decode_step
from batching_engine.model.kv_cache import kv_cache_dtype
from batching_engine.model.step_metadata import paged_metadata
from batching_engine.model_runner import ModelRunner
from batching_engine.sequence import SamplingParams, Sequence
from bench.engine_throughput import smollm2_model


def prefilled(runner: ModelRunner, batch: int) -> list[Sequence]:
    """`batch` sequences of 40 to 85 prompt tokens, their prompts in the cache and a first
    token sampled, with blocks for 256 more."""
    params = SamplingParams(temperature=0.0, max_tokens=1 << 20)
    seqs = [Sequence([5 + (7 * i + j) % 4000 for j in range(40 + 3 * i)], params)
            for i in range(batch)]  # fmt: skip
    free = list(range(runner.num_kv_blocks))
    for seq in seqs:
        blocks = runner.kv_layout.blocks_needed(seq.num_tokens + 256)
        seq.block_table.extend(free.pop() for _ in range(blocks))
    advance(seqs, runner.execute([(seq, seq.num_tokens) for seq in seqs]))
    return seqs


def advance(seqs: list[Sequence], tokens: list[int | None]) -> None:
    """Each sequence's chunk computed, and the token sampled after it appended."""
    for seq, token in zip(seqs, tokens, strict=True):
        seq.num_computed_tokens = seq.num_tokens
        assert token is not None, "every chunk here ends its sequence"
        seq.output_token_ids.append(token)


def step_paths(runner: ModelRunner, seqs: list[Sequence]) -> dict[str, Callable[[], object]]:
    """The same decode step through each path: forward and LM head."""
    model, trunk = runner.model, runner.model.model
    ids = torch.tensor([seq.token_ids[-1] for seq in seqs])
    meta = paged_metadata(
        [seq.num_tokens - 1 for seq in seqs], [1] * len(seqs),
        [seq.block_table for seq in seqs], runner.block_size, runner.device,
    )  # fmt: skip
    caches = runner.kv_caches
    assert cpu_decode_step.native_step(trunk, trunk.embed_tokens(ids), meta, caches), (
        f"the native step does not apply: {cpu_decode_step.describe(trunk)}"
    )
    return {
        "native": lambda: model.compute_logits(trunk(ids, meta, caches)),
        "modules": lambda: model.compute_logits(
            trunk.run_layers(trunk.embed_tokens(ids), meta, caches)
        ),
    }


def median_ms(times: list[float]) -> float:
    return round(statistics.median(times) * 1000, 2)


@torch.inference_mode()
def measure(mode: str, batch: int, steps: int) -> dict[str, float]:
    runner = ModelRunner(
        smollm2_model(), kv_cache_memory_bytes=512 << 20, max_model_len=2048,
        max_num_seqs=max(batch, 1), quantization=mode,
        kv_cache_dtype=kv_cache_dtype(torch.device("cpu"), torch.float32),  # the served choice
    )  # fmt: skip
    seqs = prefilled(runner, batch)
    paths = step_paths(runner, seqs)
    times: dict[str, list[float]] = {name: [] for name in (*paths, "runner")}
    for _ in range(steps):
        for name, run in paths.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    for _ in range(steps):
        start = time.perf_counter()
        tokens = runner.execute([(seq, 1) for seq in seqs])
        times["runner"].append(time.perf_counter() - start)
        advance(seqs, tokens)
    return {name: median_ms(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="int4,int8")
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    assert args.steps < 256, "the sequences have room for 256 more tokens"
    print(f"torch threads: {torch.get_num_threads()}")
    print(f"{'weights':>8} {'batch':>5} {'modules ms':>11} {'native ms':>10} {'speedup':>8}"
          f" {'runner ms':>10}")  # fmt: skip
    for mode in args.modes.split(","):
        for batch in (int(b) for b in args.batches.split(",")):
            ms = measure(mode, batch, args.steps)
            speedup = ms["modules"] / ms["native"]
            print(f"{mode:>8} {batch:>5} {ms['modules']:>11} {ms['native']:>10}"
                  f" {speedup:>7.2f}x {ms['runner']:>10}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
