"""One decode step's matmuls on the CPU: float32 against each way of multiplying int8/int4 weights.

Why the engine's CPU path dequantizes (batching_engine/model/quantization.py): for every
projection of SmolLM2-135M (30 layers) and its tied LM head, at 1 and at 64 rows, this times

- ``float32``: the engine's linear (oneDNN) over float32 weights, packed as the engine packs them;
- ``int8 fused`` / ``int4 fused``: torch's own kernels, ``_weight_int8pack_mm`` and
  ``_weight_int4pack_mm_for_cpu`` (the CPU's int4 packing);
- ``int8 engine`` / ``int4 engine``: the engine's `QuantizedLinear`, as it runs.

and prints each step's milliseconds and its ratio to float32, all measured in one run.

    .venv/bin/python bench/quantized_matmul.py [--threads N] [--rows 1,64]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

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
LAYER_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)]  # qkv, o, gate_up, down
LAYERS = 30
VOCAB, HIDDEN = 49152, 576


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
    if head:  # a tied LM head is int8 rows in both modes
        embedding = _filled(QuantizedEmbedding(out_features, in_features, torch.float32), weight)
        engine8 = engine4 = embedding.as_head
    else:
        engine8 = _filled(QuantizedLinear(in_features, out_features, "int8", torch.float32), weight)
        engine4 = _filled(QuantizedLinear(in_features, out_features, "int4", torch.float32), weight)
    return {
        "float32": plain,
        "int8 fused": lambda x: torch.ops.aten._weight_int8pack_mm(x, codes8, scales8),
        "int4 fused": lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(
            x, packed4, INT4_GROUP_SIZE, scales_and_zeros
        ),
        "int8 engine": engine8,
        "int4 engine": engine4,
    }


def _filled(module, weight: torch.Tensor):
    module.load_rows(0, weight)
    module.finish()
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    parser.add_argument("--rows", default="1,64", help="decode batch sizes to time")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()},"
          f" {torch.get_num_threads()} threads; SmolLM2-135M decode-step matmuls, ms")  # fmt: skip
    for rows in (int(r) for r in args.rows.split(",")):
        total = step_ms(rows)
        base = total["float32"]
        cells = "  ".join(f"{name} {ms:8.1f} ({ms / base:5.2f}x)" for name, ms in total.items())
        print(f"rows {rows:>4}: {cells}", flush=True)


if __name__ == "__main__":
    main()
