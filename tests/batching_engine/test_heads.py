"""Single-pass tasks: embeddings and class logits equal transformers' for the same weights.

Inputs of different lengths go through in one flat batch; transformers runs each alone.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaForSequenceClassification, LlamaModel

from batching_engine.model_runner import ModelRunner
from harness.tiny_llama import save_tiny_llama
from infergrid.errors import ContractError

INPUTS = [[5, 9, 200, 17], [3], [44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54], [250, 1]]


def hf_pooled(model: LlamaModel, ids: list[int], mode: str) -> torch.Tensor:
    with torch.no_grad():
        states = model(torch.tensor([ids])).last_hidden_state[0]
    pooled = states.mean(dim=0) if mode == "mean" else states[-1]
    return F.normalize(pooled, dim=-1)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory):
    path = tmp_path_factory.mktemp("embedder")
    return save_tiny_llama(path, model_class=LlamaModel), ModelRunner(path)


@pytest.mark.parametrize("mode", ["mean", "last"])
def test_embeddings_are_transformers_hidden_states_pooled_and_normalised(embedder, mode):
    reference, runner = embedder
    ours = runner.embed(INPUTS, pooling=mode)
    expected = torch.stack([hf_pooled(reference, ids, mode) for ids in INPUTS])
    assert ours.shape == (4, 64)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours.norm(dim=-1), torch.ones(4))


def test_an_embedding_model_holds_no_kv_cache(embedder):
    _, runner = embedder
    assert runner.num_kv_blocks == 0 and runner.kv_caches == []


def test_class_logits_are_transformers_score_at_the_last_token(tmp_path):
    reference = save_tiny_llama(tmp_path, model_class=LlamaForSequenceClassification, num_labels=3)
    runner = ModelRunner(tmp_path)
    with torch.no_grad():
        expected = torch.cat([reference(torch.tensor([ids])).logits for ids in INPUTS])
    torch.testing.assert_close(runner.classify(INPUTS), expected, rtol=1e-5, atol=1e-5)


def test_a_generation_model_embeds_with_its_decoder_but_cannot_classify(tmp_path):
    save_tiny_llama(tmp_path)
    runner = ModelRunner(tmp_path, kv_cache_memory_bytes=1 << 20, max_model_len=64)
    assert runner.embed(INPUTS[:2], pooling="last").shape == (2, 64)
    with pytest.raises(ContractError, match="^model.task: LlamaForCausalLM has no classification"):
        runner.classify(INPUTS)


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ([[1, 2], []], r"^input\[1\]: needs 1 to 256 tokens, got 0"),
        ([[1, 256]], r"^input\[0\]: token id 256 is outside the vocabulary \(0..255\)"),
        ([], "^input: must hold at least one input"),
    ],
)
def test_bad_inputs_are_refused_naming_the_input(embedder, inputs, message):
    _, runner = embedder
    with pytest.raises(ContractError, match=message):
        runner.embed(inputs)


def test_an_unknown_pooling_mode_is_refused(embedder):
    _, runner = embedder
    with pytest.raises(ContractError, match="^pooling: 'max' is not one of mean, last, cls"):
        runner.embed(INPUTS, pooling="max")
