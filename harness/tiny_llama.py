"""Tiny random decoders made on the spot, and the two ways the tests decode with them.

`save_tiny_llama` builds a transformers model (the reference) and saves it HF-format;
`save_tiny_decoder` does the same for another family of the shared decoder (Qwen2, Qwen3,
Mistral), with its biases and norms drawn at random so that each one shows in the tokens;
`runner_greedy` drives our ModelRunner the way the engine would (blocks from a shuffled free
list, optional chunked prefill, every live sequence in every step), without the engine.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from batching_engine.model_runner import ModelRunner
from batching_engine.sequence import SamplingParams, Sequence

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,  # GQA: two query heads per KV head
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    initializer_range=0.3,  # peaked logits: greedy ties would make the comparison luck
)
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,  # small, so some frequencies are really scaled
}


# model_type -> transformers' config and causal LM of that family.
FAMILIES: dict[str, tuple[type[PretrainedConfig], type[PreTrainedModel]]] = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
    "phi3": (Phi3Config, Phi3ForCausalLM),
    "mixtral": (MixtralConfig, MixtralForCausalLM),
    "gemma2": (Gemma2Config, Gemma2ForCausalLM),
    "gemma3_text": (Gemma3TextConfig, Gemma3ForCausalLM),
}


def save_tiny_llama(
    path: Path,
    *,
    model_class: type[PreTrainedModel] = LlamaForCausalLM,
    seed: int = 0,
    **overrides,
) -> PreTrainedModel:
    """A random model saved as safetensors in `path`; returns it (float32, eval mode)."""
    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY, **overrides})
    model = model_class(config).eval()
    model.save_pretrained(path)
    return model


def save_tiny_decoder(path: Path, family: str, *, seed: int = 0, **overrides) -> PreTrainedModel:
    """A random causal LM of `family` saved in `path`, as `save_tiny_llama`. transformers starts
    biases at 0 and norm weights at 1, where a wrong or missing one changes nothing; here
    every bias and norm weight is drawn too."""
    config_class, model_class = FAMILIES[family]
    torch.manual_seed(seed)
    settings = {**TINY, **overrides}
    settings.setdefault("head_dim", settings["hidden_size"] // settings["num_attention_heads"])
    config = config_class(**settings)
    model = model_class(config).eval()
    # Gemma's norms scale by 1 + weight: their weights are drawn around 0, the others' at 1.
    norm_mean = 0.0 if family.startswith("gemma") else 1.0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:
                param.normal_(norm_mean if "norm" in name else 0.0, 0.3)
    model.save_pretrained(path)
    return model


def hf_greedy(model: PreTrainedModel, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' own greedy decoding, batch 1, never stopping early."""
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),  # else generate masks prompt tokens equal to pad
            max_new_tokens=max_new_tokens,
            do_sample=False,
            top_k=None,
            top_p=None,
        )
    return out[0, len(prompt) :].tolist()


def runner_greedy(
    runner: ModelRunner,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    chunk_size: int | None = None,
    seed: int = 0,
) -> list[list[int]]:
    """Greedy tokens for all prompts decoded together, each step holding every live sequence."""
    free_blocks = list(range(runner.num_kv_blocks))
    random.Random(seed).shuffle(free_blocks)
    params = SamplingParams(temperature=0.0, max_tokens=max_new_tokens)
    seqs = [Sequence(list(prompt), params) for prompt in prompts]
    live = list(seqs)
    while live:
        batch = []
        for seq in live:
            n = min(chunk_size or seq.num_uncomputed_tokens, seq.num_uncomputed_tokens)
            while len(seq.block_table) * runner.block_size < seq.num_computed_tokens + n:
                seq.block_table.append(free_blocks.pop())
            batch.append((seq, n))
        for (seq, n), token in zip(batch, runner.execute(batch), strict=True):
            seq.num_computed_tokens += n
            if token is not None:
                seq.output_token_ids.append(token)
        live = [seq for seq in live if len(seq.output_token_ids) < max_new_tokens]
    return [seq.output_token_ids for seq in seqs]
