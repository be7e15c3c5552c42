"""Our Llama decodes exactly what transformers decodes, for the variants the loader accepts.

Each model is a tiny random Llama with grouped-query attention (4 query heads over 2 KV heads),
built by transformers and saved as safetensors; transformers' `generate` is the reference.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from batching_engine.model.loader import load_model
from batching_engine.model_runner import ModelRunner
from batching_engine.sequence import SamplingParams, Sequence
from harness.tiny_llama import (
    LLAMA3_ROPE,
    hf_greedy,
    runner_greedy,
    save_tiny_llama,
)
from infergrid.errors import ContractError

VARIANTS = {
    "plain": {},
    "llama3-rope-tied": {"rope_scaling": LLAMA3_ROPE, "tie_word_embeddings": True},
    "linear-rope": {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
}


def prompts(*lengths: int, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=generator).tolist() for n in lengths]


def runner_for(model_dir, **kwargs) -> ModelRunner:
    return ModelRunner(model_dir, kv_cache_memory_bytes=1 << 20, max_model_len=128, **kwargs)


@pytest.mark.parametrize("variant", VARIANTS)
def test_greedy_tokens_equal_transformers_at_batch_1(tmp_path, variant):
    reference = save_tiny_llama(tmp_path, **VARIANTS[variant])
    runner = runner_for(tmp_path)
    for prompt in prompts(1, 9, 40):
        assert runner_greedy(runner, [prompt], 20) == [hf_greedy(reference, prompt, 20)]


def test_tied_model_reads_its_embedding_as_lm_head(tmp_path):
    save_tiny_llama(tmp_path, tie_word_embeddings=True)
    _, model = load_model(tmp_path)
    assert model.lm_head is None
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")


def test_sequences_batched_together_with_chunked_prefill_decode_as_if_alone(tmp_path):
    reference = save_tiny_llama(tmp_path, rope_scaling=LLAMA3_ROPE)
    runner = runner_for(tmp_path)
    batch = prompts(3, 17, 40, 1, 26)
    expected = [hf_greedy(reference, prompt, 12) for prompt in batch]
    assert runner_greedy(runner, batch, 12, chunk_size=7) == expected


def test_a_chunk_that_stops_short_of_the_end_samples_nothing(tmp_path):
    save_tiny_llama(tmp_path)
    runner = runner_for(tmp_path)
    seq = Sequence(prompts(20)[0], SamplingParams(temperature=0.0))
    seq.block_table = [3, 1]
    assert runner.execute([(seq, 12)]) == [None]
    seq.num_computed_tokens = 12
    [token] = runner.execute([(seq, 8)])
    assert isinstance(token, int) and 0 <= token < 256


def test_weights_split_over_several_safetensors_files_load(tmp_path):
    reference = save_tiny_llama(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").unlink()
    names = sorted(weights)
    save_file({n: weights[n] for n in names[::2]}, tmp_path / "model-00001-of-00002.safetensors")
    save_file({n: weights[n] for n in names[1::2]}, tmp_path / "model-00002-of-00002.safetensors")
    [prompt] = prompts(8)
    assert runner_greedy(runner_for(tmp_path), [prompt], 6) == [hf_greedy(reference, prompt, 6)]


def test_a_missing_weight_is_named(tmp_path):
    save_tiny_llama(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ContractError, match=r"model\.layers\.1\.mlp\.gate_up_proj\.weight"):
        load_model(tmp_path)


def test_an_unknown_architecture_is_refused_naming_the_field(tmp_path):
    save_tiny_llama(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["architectures"] = ["LlamaForTokenClassification"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ContractError, match="^architectures: 'LlamaForTokenClassification'"):
        load_model(tmp_path)


def test_a_kv_budget_below_one_max_length_sequence_is_refused(tmp_path):
    save_tiny_llama(tmp_path)
    # One block of 16 tokens: 2 layers x (K, V) x 16 x 2 heads x 16 dims x 4 bytes = 8 KiB.
    with pytest.raises(
        ContractError, match=r"^kv_cache_memory: .* holds 7 blocks .* needs 8 blocks"
    ):
        ModelRunner(tmp_path, kv_cache_memory_bytes=7 * 8192, max_model_len=128)
    assert (
        ModelRunner(tmp_path, kv_cache_memory_bytes=8 * 8192, max_model_len=128).num_kv_blocks == 8
    )


def test_max_model_len_beyond_the_model_is_refused(tmp_path):
    save_tiny_llama(tmp_path)
    with pytest.raises(ContractError, match="^max_model_len: must be 1 to the model's"):
        ModelRunner(tmp_path, kv_cache_memory_bytes=1 << 20, max_model_len=257)
