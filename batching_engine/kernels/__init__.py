"""The engine's GPU kernels: Triton on CUDA tensors, their torch references everywhere else.

The model calls `dispatch` only:

- `decode_attention(q, k_cache, v_cache, block_tables, context_lens, scale=None, plan=None,
  window=None, softcap=None)`
- `prefill_attention(q, k_cache, v_cache, block_tables, context_lens, cu_seqlens_q,
  scale=None, max_query_len=None, window=None, softcap=None)`
- `write_kv_cache(key, value, k_cache, v_cache, slot_mapping)`
- `fused_add_rmsnorm(x, residual, weight, eps) -> (normed, new_residual)`
- `rotary_embedding(positions, q, k, cos, sin) -> (q, k)`
- `silu_and_mul(x)`

and `set_kernel_backend("auto" | "triton" | "torch")` (or `INFERGRID_KERNELS`) to force a path.
`cuda_graphs.DecodeGraphs` captures decode steps for a ladder of batch sizes. Each kernel file
holds the Triton kernel, its checking launcher (`*_triton`) and its torch reference
(`*_reference`).
"""
