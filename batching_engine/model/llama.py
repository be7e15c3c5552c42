"""The Llama decoder (and its kin: Qwen2, Qwen3, Mistral, Gemma 2 and 3) over one flat batch of
tokens from many sequences.

There is no batch dimension: a step's tokens are concatenated ([num_tokens, hidden]) and the
attention metadata says which sequence, position and cache slot each belongs to. Linear layers
therefore see one large matmul per step whatever the mix of prefill chunks and decodes. Everything
between the matmuls (norms, rotary, KV writes, attention, the MLP gate) goes through
`batching_engine.kernels.dispatch`, which picks the Triton kernel or its torch reference.

Parameter names follow HF's (`model.layers.3.self_attn...`) except for the two fused
projections, `qkv_proj` and `gate_up_proj`, which the loader fills shard by shard. The
families differ in a few places: Qwen2 adds biases to q, k and v; Qwen3 and Gemma 3 norm
each query and key head before rotary (`q_norm`, `k_norm`, one weight shared by every head);
Gemma norms each sublayer's output (`SandwichDecoderLayer`), scales its embedding, gates its
MLP with GELU and may soft-cap its logits; Gemma 2 soft-caps its attention scores too, and
Gemma 3 gives its sliding layers a rope base of their own.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from batching_engine.kernels import cpu_decode_step, dispatch
from batching_engine.model.attention import (
    DenseAttentionMetadata,
    PagedAttentionMetadata,
    dense_causal_attention,
    paged_attention,
)
from batching_engine.model.config import LlamaConfig
from batching_engine.model.layers import Embedding, Linear, RMSNorm, SwiGLUMLP
from batching_engine.model.moe import SparseMoE
from batching_engine.model.rope import RotaryEmbedding
from batching_engine.model.tensor_parallel import SINGLE, TensorParallel, kv_heads, query_heads

AttentionMetadata = PagedAttentionMetadata | DenseAttentionMetadata
KVCache = tuple[torch.Tensor, torch.Tensor]
RopeTables = tuple[torch.Tensor, torch.Tensor]  # cos, sin: [max_positions, head_dim]


class LlamaAttention(nn.Module):
    """Grouped-query self-attention: q, k and v from one fused projection. Under tensor
    parallelism it holds this rank's heads only, and sums `o_proj`'s output over the ranks
    (whose bias, if any, only rank 0 holds, so it is added once)."""

    def __init__(
        self, config: LlamaConfig, tp: TensorParallel = SINGLE, window: int | None = None
    ) -> None:
        super().__init__()
        self.tp = tp
        self.window = window  # a sliding-window layer's: it sees the last `window` tokens
        self.num_heads = len(
            query_heads(config.num_attention_heads, config.num_key_value_heads, tp)
        )
        self.num_kv_heads = len(kv_heads(config.num_key_value_heads, tp))
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = config.scale
        self.softcap = config.attn_logit_softcapping
        self.qkv_proj = Linear(
            config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias
        )
        self.o_proj = Linear(self.q_size, config.hidden_size, bias=config.o_bias and tp.rank == 0)
        self.q_norm = norm(config, self.head_dim) if config.qk_norm else None
        self.k_norm = norm(config, self.head_dim) if config.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        meta: AttentionMetadata,
        kv_cache: KVCache | None,
    ) -> torch.Tensor:
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.reshape(-1, self.head_dim))[0].view_as(q)
            k = self.k_norm(k.reshape(-1, self.head_dim))[0].view_as(k)
        q, k = dispatch.rotary_embedding(meta.positions, q, k, *rope)
        if isinstance(meta, DenseAttentionMetadata):
            out = dense_causal_attention(q, k, v, meta, self.scale, self.window, self.softcap)
        else:
            assert kv_cache is not None, "paged attention needs this layer's KV cache"
            dispatch.write_kv_cache(k, v, kv_cache[0], kv_cache[1], meta.slot_mapping)
            out = paged_attention(
                q, kv_cache[0], kv_cache[1], meta, self.scale, self.window, self.softcap
            )
        return self.tp.all_reduce(self.o_proj(out.reshape(-1, self.q_size)))


def norm(config: LlamaConfig, size: int) -> RMSNorm:
    """An RMSNorm of the family's kind (Gemma's scale by 1 + weight)."""
    return RMSNorm(size, config.rms_norm_eps, config.norm_offset)


def mlp(config: LlamaConfig, tp: TensorParallel) -> SwiGLUMLP | SparseMoE:
    """The layer's MLP: a gated one, or Mixtral's mixture of them."""
    if config.num_experts:
        return SparseMoE(
            config.hidden_size, config.intermediate_size, config.num_experts,
            config.experts_per_token, tp, config.hidden_act,
        )  # fmt: skip
    return SwiGLUMLP(config.hidden_size, config.intermediate_size, tp, config.hidden_act)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm attention then pre-norm MLP, each added to the residual stream."""

    # The block `kernels/cpu_decode_step.c` computes; a subclass that adds to it says False.
    plain_pre_norm: ClassVar[bool] = True

    def __init__(
        self, config: LlamaConfig, tp: TensorParallel = SINGLE, window: int | None = None
    ) -> None:
        super().__init__()
        self.input_layernorm = norm(config, config.hidden_size)
        self.self_attn = LlamaAttention(config, tp, window)
        self.post_attention_layernorm = norm(config, config.hidden_size)
        self.mlp = mlp(config, tp)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RopeTables,
        meta: AttentionMetadata,
        kv_cache: KVCache | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (this block's MLP output, the residual stream before it); the next norm
        adds them, so each residual add happens once, inside a norm."""
        hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(hidden, rope, meta, kv_cache)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class SandwichDecoderLayer(LlamaDecoderLayer):
    """Gemma's block: the attention's and the MLP's outputs are normed too before each is
    added to the residual stream (four norms, named as transformers names them: Llama's
    `post_attention_layernorm` norms the attention's output here)."""

    plain_pre_norm: ClassVar[bool] = False

    def __init__(
        self, config: LlamaConfig, tp: TensorParallel = SINGLE, window: int | None = None
    ) -> None:
        super().__init__(config, tp, window)
        self.pre_feedforward_layernorm = norm(config, config.hidden_size)
        self.post_feedforward_layernorm = norm(config, config.hidden_size)

    def forward(
        self,
        hidden: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RopeTables,
        meta: AttentionMetadata,
        kv_cache: KVCache | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As `LlamaDecoderLayer.forward`: the next norm adds the two it returns."""
        hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(hidden, rope, meta, kv_cache))[0]
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden))[0], residual


class LlamaModel(nn.Module):
    """Embedding, decoder layers and the final norm: token ids in, hidden states out. A
    family whose sliding layers rotate with their own base (Gemma 3) has a second table."""

    def __init__(self, config: LlamaConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size, config.embed_scale)
        self.rotary = RotaryEmbedding(
            config.head_dim, config.max_position_embeddings, config.rope_theta, config.rope_scaling
        )
        self.local_rotary = (
            None
            if config.local_rope_theta is None
            else RotaryEmbedding(
                config.head_dim, config.max_position_embeddings, config.local_rope_theta, None
            )
        )
        self.sliding_layers = config.sliding_layers or (False,) * config.num_hidden_layers
        layer = SandwichDecoderLayer if config.gemma else LlamaDecoderLayer
        self.layers = nn.ModuleList(
            layer(config, tp, config.sliding_window if sliding else None)
            for sliding in self.sliding_layers
        )
        self.norm = norm(config, config.hidden_size)

    def rope_of(self, index: int) -> RopeTables:
        """The cos/sin tables layer `index` rotates with."""
        rotary = self.rotary
        if self.local_rotary is not None and self.sliding_layers[index]:
            rotary = self.local_rotary
        return rotary.cos, rotary.sin

    def forward(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache] | None = None,
    ) -> torch.Tensor:
        """input_ids: [num_tokens]; returns the normed hidden states, [num_tokens, hidden]. A
        decode-only step on the CPU runs its layers in one native call where it can
        (`cpu_decode_step`), else through `run_layers`."""
        hidden = self.embed_tokens(input_ids)
        native = cpu_decode_step.native_step(self, hidden, meta, kv_caches)
        if native is not None:
            return native(hidden, meta)
        return self.run_layers(hidden, meta, kv_caches)

    def run_layers(
        self,
        hidden: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache] | None = None,
    ) -> torch.Tensor:
        """The embedded tokens through every layer and the final norm, module by module: the
        path of every step but a native one, and its reference."""
        residual = None
        for index, layer in enumerate(self.layers):
            cache = kv_caches[index] if kv_caches else None
            hidden, residual = layer(hidden, residual, self.rope_of(index), meta, cache)
        return self.norm(hidden, residual)[0]


class LlamaForCausalLM(nn.Module):
    """The decoder plus an LM head, which is the embedding matrix when the model ties them."""

    def __init__(self, config: LlamaConfig, tp: TensorParallel = SINGLE) -> None:
        super().__init__()
        self.model = LlamaModel(config, tp)
        self.softcap = config.final_logit_softcapping
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache] | None = None,
    ) -> torch.Tensor:
        return self.model(input_ids, meta, kv_caches)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits for the given hidden states only: the runner passes just the sampled rows;
        soft-capped as softcap * tanh(logits / softcap) where the model says (Gemma 2)."""
        if self.lm_head is None:
            logits = self.model.embed_tokens.as_head(hidden)
        else:
            logits = self.lm_head(hidden)
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap
