"""Compile every kernel ahead of time for CUDA targets, with no GPU: `python -m` this module.

The interpreter runs kernels as numpy and lets through what the GPU compiler rejects (`tl.dot`
with a dimension under 16, shared memory overflow, type errors in paths the tests never take).
Here each launcher's *GPU* plan — the very grid, arguments, constants and warps it would launch —
is built from meta tensors of realistic model shapes, and handed to Triton's compiler down to a
cubin for each target. Triton's interpreter mode must be off (it swaps `triton.jit` for Python).

Usage: `python -m tests.batching_engine.kernels.aot_compile 80 90`; prints one line per
kernel and target, exits 1 if any failed.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Iterator
from typing import Any

import torch
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from batching_engine.kernels import (
    decode_attention,
    kv_cache_write,
    prefill_attention,
    rmsnorm,
    rotary,
    silu_and_mul,
)
from batching_engine.kernels._launch import Launch

META = torch.device("meta")
TRITON_TYPES = {
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float32: "fp32",
    torch.int32: "i32",
    torch.int64: "i64",
}
# Shared memory one block may use (the opt-in maximum): the GPU refuses to load more, which
# only shows at launch, so it is checked here.
SHARED_MEMORY_LIMIT = {80: 166912, 90: 232448}
Case = tuple[str, Any, Launch]


def empty(*shape: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=META)


def elementwise_cases() -> Iterator[Case]:
    """bf16 and fp32 for each elementwise kernel (fp16 compiles like bf16); variants in bf16."""
    for dtype in (torch.bfloat16, torch.float32):
        name = TRITON_TYPES[dtype]
        plan = silu_and_mul.silu_and_mul_plan(
            empty(8, 2 * 11008, dtype=dtype), empty(8, 11008, dtype=dtype)
        )
        yield f"silu_and_mul/{name}", silu_and_mul._silu_and_mul_kernel, plan
        rows = [empty(8, 4096, dtype=dtype) for _ in range(4)]
        weight = empty(4096, dtype=dtype)
        plan = rmsnorm.fused_add_rmsnorm_plan(rows[0], rows[1], weight, 1e-6, rows[2], rows[3])
        yield f"add_rmsnorm/{name}", rmsnorm._fused_add_rmsnorm_kernel, plan
        q, k = empty(8, 32, 128, dtype=dtype), empty(8, 8, 128, dtype=dtype)
        cos, positions = empty(4096, 64, dtype=torch.float32), empty(8, dtype=torch.int64)
        plan = rotary.rotary_plan(positions, q, k, cos, cos, q, k)
        yield f"rotary-partial/{name}", rotary._rotary_kernel, plan
        key, cache = empty(8, 8, 128, dtype=dtype), empty(64, 16, 8, 128, dtype=dtype)
        slots = empty(8, dtype=torch.int64 if dtype == torch.bfloat16 else torch.int32)
        plan = kv_cache_write.kv_cache_write_plan(key, key, cache, cache, slots)
        yield f"kv_cache_write/{name}", kv_cache_write._kv_cache_write_kernel, plan
    rows = [empty(8, 4096, dtype=torch.bfloat16) for _ in range(2)]
    plan = rmsnorm.fused_add_rmsnorm_plan(rows[0], None, empty(4096), 1e-6, rows[1], None)
    yield "rmsnorm/bf16", rmsnorm._fused_add_rmsnorm_kernel, plan
    q, k = empty(8, 32, 128, dtype=torch.bfloat16), empty(8, 8, 128, dtype=torch.bfloat16)
    cos, positions = empty(4096, 128, dtype=torch.float32), empty(8, dtype=torch.int64)
    plan = rotary.rotary_plan(positions, q, k, cos, cos, q, k)
    yield "rotary/bf16", rotary._rotary_kernel, plan


# (dtype, num_heads, num_kv_heads, head_dim, block_size, softcap): Llama-3-8B-like in every
# dtype, then SmolLM2-135M (a group of 3, blocks of 256), a wide head, and Gemma-2-2B-like
# soft-capped scores in bf16.
ATTENTION_SHAPES = (
    (torch.bfloat16, 32, 8, 128, 16, None),
    (torch.float16, 32, 8, 128, 16, None),
    (torch.float32, 32, 8, 128, 16, None),
    (torch.bfloat16, 9, 3, 64, 256, None),
    (torch.bfloat16, 8, 2, 256, 32, None),
    (torch.bfloat16, 8, 4, 256, 16, 50.0),
)


def attention_cases() -> Iterator[Case]:
    for dtype, heads, kv_heads, head_dim, block_size, softcap in ATTENTION_SHAPES:
        tag = f"{TRITON_TYPES[dtype]}/h{heads}kv{kv_heads}d{head_dim}b{block_size}"
        tag += "/softcap" if softcap else ""
        cache = empty(64, block_size, kv_heads, head_dim, dtype=dtype)
        tables, lens = empty(4, 32, dtype=torch.int32), empty(4, dtype=torch.int32)
        q = empty(4, heads, head_dim, dtype=dtype)
        for splits in (1, 8):
            attention, merge = decode_attention.decode_attention_plan(
                q, cache, cache, tables, lens, q, 0.1, splits, interpreted=False, softcap=softcap
            )
            yield (
                f"decode/{tag}/splits{splits}",
                decode_attention._decode_attention_kernel,
                attention,
            )
            if merge is not None:
                yield f"decode_merge/{tag}", decode_attention._decode_reduce_kernel, merge
        q, cu = empty(300, heads, head_dim, dtype=dtype), empty(5, dtype=torch.int32)
        plan = prefill_attention.prefill_attention_plan(
            q, cache, cache, tables, lens, cu, q, 0.1, 200, interpreted=False, softcap=softcap
        )
        yield f"prefill/{tag}", prefill_attention._prefill_attention_kernel, plan


def all_cases() -> list[Case]:
    return [*elementwise_cases(), *attention_cases()]


def as_jit(kernel: Any) -> triton.runtime.jit.JITFunction:
    if not isinstance(kernel, triton.runtime.jit.JITFunction):
        raise RuntimeError("kernels are not JITFunctions: unset TRITON_INTERPRET for this compile")
    return kernel


def argument_type(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return "*" + TRITON_TYPES[value.dtype]
    if isinstance(value, bool):
        return "i1"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "fp32"
    raise TypeError(f"no Triton type for argument {value!r}")


def compile_case(kernel: Any, launch: Launch, arch: int) -> triton.compiler.CompiledKernel:
    """Compile as the JIT would: pointers and multiples of 16 carry the divisibility hint."""
    fn = as_jit(kernel)
    runtime_args = [name for name in fn.arg_names if name not in launch.constexprs]
    signature = {name: argument_type(v) for name, v in zip(runtime_args, launch.args, strict=True)}
    signature |= {name: "constexpr" for name in launch.constexprs}
    attrs = {
        (fn.arg_names.index(name),): [["tt.divisibility", 16]]
        for name, value in zip(runtime_args, launch.args, strict=True)
        if isinstance(value, torch.Tensor)
        or (isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0)
    }
    source = ASTSource(fn, signature, dict(launch.constexprs), attrs)
    options = {"num_warps": launch.num_warps, "num_stages": launch.num_stages}
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


@triton.jit
def _dot_too_small(x_ptr, out_ptr, K: tl.constexpr):
    rows, cols = tl.arange(0, 16), tl.arange(0, K)
    a = tl.load(x_ptr + rows[:, None] * K + cols[None, :])
    b = tl.load(x_ptr + cols[:, None] * 16 + rows[None, :])
    tl.store(out_ptr + rows[:, None] * 16 + rows[None, :], tl.dot(a, b))


def compiler_rejects_small_dot(arch: int) -> bool:
    """The control: this harness must catch what the interpreter lets through."""
    x = empty(16 * 16)
    launch = Launch(grid=(1,), args=(x, empty(16 * 16, dtype=torch.float32)), constexprs={"K": 8})
    try:
        compile_case(_dot_too_small, launch, arch)
    except triton.compiler.errors.CompilationError:
        return True
    return False


def main(argv: list[str]) -> int:
    archs = [int(a) for a in argv] or [80, 90]
    failures = 0
    for arch in archs:
        rejected = compiler_rejects_small_dot(arch)
        failures += not rejected
        print(f"sm_{arch}: compiler rejects tl.dot with K=8: {'yes' if rejected else 'NO'}")
    for arch in archs:
        for name, kernel, launch in all_cases():
            try:
                compiled = compile_case(kernel, launch, arch)
                shared = compiled.metadata.shared
                if shared > SHARED_MEMORY_LIMIT[arch]:
                    raise RuntimeError(f"{shared} B of shared memory > {SHARED_MEMORY_LIMIT[arch]}")
                print(f"ok   sm_{arch} {name} shared={shared}B", flush=True)
            except Exception:  # report every failure, then fail once at the end
                failures += 1
                print(f"FAIL sm_{arch} {name}\n{traceback.format_exc()}", flush=True)
    print(f"{failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
