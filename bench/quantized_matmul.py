"""One decode step's matmuls on the CPU: float32 against each way of multiplying int8/int4 weights.

Why the engine's CPU path is its own kernel (batching_engine/model/quantization.py): for every
projection of SmolLM2-135M (30 layers) and its tied LM head, at 1 and at 64 rows, this times

- ``float32``: the engine's linear (oneDNN) over float32 weights, packed as the engine packs them;
- ``int8 fused`` / ``int4 fused``: torch's own kernels, ``_weight_int8pack_mm`` and
  ``_weight_int4pack_mm_for_cpu`` (the CPU's int4 packing);
- ``int8 kernel`` / ``int4 kernel``: the engine's `QuantizedLinear` through its C kernel
  (kernels/cpu_quantized_matmul.c), as it runs where the kernel is built;
- ``int8 dequant`` / ``int4 dequant``: the same layers where it is not (rows dequantized into a
  scratch buffer, then oneDNN);

and prints each step's milliseconds and its ratio to float32, all measured in one run. Each
shape's weight is one tensor timed again and again, so the small ones stay in cache: float32
is favoured against what a whole model streaming from memory sees.

With ``--vnni`` it prints instead, for each SmolLM2 shape, int8 and int4, the kernel's float
build (x as given: ``INFERGRID_CPU_KERNEL=avx512``) beside its VNNI build (x quantized to
int8 per block of 32, integer dot products: ``auto`` on a CPU with VNNI), in microseconds per
matmul, and the float time over the VNNI time.

    .venv/bin/python bench/quantized_matmul.py [--threads N] [--rows 1,64]
    .venv/bin/python bench/quantized_matmul.py --vnni [--threads N] [--rows 1,4,16,64]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import torch

from batching_engine.kernels import cpu_build, cpu_quantized_matmul
from batching_engine.model.layers import Linear
from batching_engine.model.quantization import (
    INT4_GROUP_SIZE,
    QuantizedEmbedding,
    QuantizedLinear,
    int4pack_scales_and_zeros,
    quantize_int4_rows,
    quantize_int8_rows,
)

# SmolLM2-135M: hidden 576, 9 query and 3 KV heads of 64, MLP 1536, 30 layers, vocab 49152.
LAYERS = 30
VOCAB, HIDDEN = 49152, 576
NAMED_SHAPES = {  # [out, in]
    "qkv": (960, 576),
    "o": (576, 576),
    "gate_up": (3072, 576),
    "down": (576, 1536),
    "head": (VOCAB, HIDDEN),
}
LAYER_SHAPES = [NAMED_SHAPES[name] for name in ("qkv", "o", "gate_up", "down")]


def seconds(run: Callable[[], object], budget: float = 1.0) -> float:
    """Best of repeated runs after a warm-up."""
    run()
    best, spent = float("inf"), 0.0
    while spent < budget:
        start = time.perf_counter()
        run()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
    return best


def ways(out_features: int, in_features: int, head: bool) -> dict[str, Callable]:
    """Each way of computing `x @ w.T` for one random weight of this shape."""
    weight = torch.randn(out_features, in_features)
    plain = Linear(in_features, out_features, bias=False)
    plain.weight.data = weight
    plain.pack(64)
    codes8, scales8 = quantize_int8_rows(weight)
    codes4, scales4, low4 = quantize_int4_rows(weight)
    scales_and_zeros = int4pack_scales_and_zeros(scales4, low4)
    packed4 = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes4.to(torch.int32), 8)
    engine = {}
    for path, kernel in (("kernel", True), ("dequant", False)):
        if head:  # a tied LM head is int8 rows in both modes
            table = QuantizedEmbedding(out_features, in_features, torch.float32)
            engine[f"int8 {path}"] = engine[f"int4 {path}"] = _filled(table, weight, kernel).as_head
            continue
        for mode in ("int8", "int4"):
            layer = QuantizedLinear(in_features, out_features, mode, torch.float32)
            engine[f"{mode} {path}"] = _filled(layer, weight, kernel)
    return {
        "float32": plain,
        "int8 fused": lambda x: torch.ops.aten._weight_int8pack_mm(x, codes8, scales8),
        "int4 fused": lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, packed4, INT4_GROUP_SIZE, scales_and_zeros
        ),
        **engine,
    }


def _filled(module, weight: torch.Tensor, kernel: bool):
    """The module filled, and laid out for the kernel or (switched off) the dequantizing path."""
    module.load_rows(0, weight)
    if kernel:  # built as INFERGRID_CPU_KERNEL asks (auto, or avx2)
        module.finish()
        return module
    saved = os.environ.get(cpu_build.ENV_VAR)
    os.environ[cpu_build.ENV_VAR] = "off"
    cpu_build.clear_cache()
    try:
        module.finish()
    finally:
        os.environ.pop(cpu_build.ENV_VAR)
        if saved is not None:
            os.environ[cpu_build.ENV_VAR] = saved
        cpu_build.clear_cache()
    return module


def step_ms(rows: int) -> dict[str, float]:
    """Milliseconds of one decode step's matmuls at `rows` rows, per way."""
    total: dict[str, float] = {}
    shapes = [(shape, LAYERS, False) for shape in LAYER_SHAPES] + [((VOCAB, HIDDEN), 1, True)]
    with torch.inference_mode():
        for (out_features, in_features), repeat, head in shapes:
            x = torch.randn(rows, in_features)
            for name, run in ways(out_features, in_features, head).items():
                spent = seconds(lambda run=run, x=x: run(x)) * repeat * 1000
                total[name] = total.get(name, 0.0) + spent
    return total


def build_us(build: str, row_counts: list[int]) -> dict[tuple[str, str, int], float]:
    """Microseconds per matmul of the kernel built as `build` (an INFERGRID_CPU_KERNEL value),
    per (shape name, mode, rows): each weight packed for that build."""
    os.environ[cpu_build.ENV_VAR] = build
    cpu_build.clear_cache()
    times = {}
    with torch.inference_mode():
        for name, (out_features, in_features) in NAMED_SHAPES.items():
            weight = torch.randn(out_features, in_features)
            packed = {
                "int8": cpu_quantized_matmul.pack_int8(*quantize_int8_rows(weight)),
                "int4": cpu_quantized_matmul.pack_int4(*quantize_int4_rows(weight)),
            }
            for mode, weights in packed.items():
                for rows in row_counts:
                    x = torch.randn(rows, in_features)
                    run = lambda x=x, w=weights: cpu_quantized_matmul.matmul(x, w)  # noqa: E731
                    times[name, mode, rows] = seconds(run, budget=0.3) * 1e6
    return times


def vnni_table(row_counts: list[int]) -> None:
    """The float build beside the VNNI build, per shape, mode and row count."""
    vnni = cpu_build.target()
    if vnni not in cpu_build.FLOAT_TWIN:
        raise SystemExit(f"no VNNI build on this CPU (auto builds {vnni}): nothing to compare")
    plain = cpu_build.FLOAT_TWIN[vnni].lower()
    saved = os.environ.get(cpu_build.ENV_VAR)
    try:
        floats, integers = build_us(plain, row_counts), build_us(vnni.lower(), row_counts)
    finally:
        os.environ.pop(cpu_build.ENV_VAR)
        if saved is not None:
            os.environ[cpu_build.ENV_VAR] = saved
        cpu_build.clear_cache()
    print(f"us per matmul: {plain} (float x) vs {vnni.lower()} (int8 x), ratio = float / vnni")
    print("   shape       n x k mode rows     float      vnni  ratio")
    for (name, mode, rows), spent in floats.items():
        n, k = NAMED_SHAPES[name]
        fast = integers[name, mode, rows]
        print(f"{name:>8} {f'{n}x{k}':>11} {mode:>4} {rows:>4} {spent:9.1f} {fast:9.1f}"
              f" {spent / fast:5.2f}x")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--rows", help="batch sizes to time (default 1,64; --vnni: 1,4,16,64)")
    parser.add_argument("--vnni", action="store_true", help="the kernel's float vs VNNI build")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    missing = cpu_quantized_matmul.available()
    if missing is not None:
        raise SystemExit(f"the engine's CPU quantized kernel is unavailable here: {missing}")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()},"
          f" kernel {cpu_build.target()}, {torch.get_num_threads()} threads")  # fmt: skip
    row_counts = [int(r) for r in (args.rows or ("1,4,16,64" if args.vnni else "1,64")).split(",")]
    if args.vnni:
        vnni_table(row_counts)
        return
    print("SmolLM2-135M decode-step matmuls, ms")
    for rows in row_counts:
        total = step_ms(rows)
        base = total["float32"]
        cells = "  ".join(f"{name} {ms:8.1f} ({ms / base:5.2f}x)" for name, ms in total.items())
        print(f"rows {rows:>4}: {cells}", flush=True)


if __name__ == "__main__":
    main()
