"""BERT encoders: embeddings and class logits equal transformers' for the same weights.

transformers runs a right-padded batch with its attention mask, as a client of it would; ours
runs the same texts, tokenized by the engine's tokenizer, as one flat batch of different lengths.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import BertForSequenceClassification

from batching_engine.loading import load
from batching_engine.main import parser, settings_from
from batching_engine.metrics import EngineMetrics
from batching_engine.model.config import MODEL_TYPES
from batching_engine.model_runner import ModelRunner
from batching_engine.tokenizer import Tokenizer
from infergrid.errors import ContractError
from tests.batching_engine.tiny_bert import hf_embeddings, padded_batch, save_tiny_bert

TEXTS = [
    "the quick brown fox",
    "a",
    "embeddings turn sentences into vectors that can be compared, while a man eats food",
    "the lazy dog plays the violin",
]


def assert_parity(ours: torch.Tensor, expected: torch.Tensor) -> None:
    assert ours.shape == expected.shape
    assert (ours - expected).abs().max() < 1e-5
    assert F.cosine_similarity(ours, expected).min() > 1 - 1e-4


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    path = tmp_path_factory.mktemp("bert")
    reference = save_tiny_bert(path)
    runner = ModelRunner(path)
    ids = [Tokenizer(path).encode(text) for text in TEXTS]
    return reference, runner, ids


def test_inputs_get_cls_and_sep_and_neither_padding_nor_truncation(encoder):
    _, runner, ids = encoder
    assert {i[0] for i in ids} == {2} and {i[-1] for i in ids} == {3}  # [CLS], [SEP]
    assert len(ids[1]) == 3 and len(ids[2]) > 16  # the saved tokenizer.json pads and cuts at 16
    assert runner.num_kv_blocks == 0 and runner.kv_caches == []


def test_mean_pooled_embeddings_equal_transformers_on_a_padded_batch(encoder):
    reference, runner, ids = encoder
    assert_parity(runner.embed(ids), hf_embeddings(reference, *padded_batch(ids)))


def test_padding_does_not_change_a_vector(encoder):
    _, runner, ids = encoder
    together = runner.embed(ids)
    alone = torch.cat([runner.embed([i]) for i in ids])
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-6)


@pytest.mark.parametrize("act", ["gelu_new", "relu"])
def test_other_activations_match_too(tmp_path, act):
    reference = save_tiny_bert(tmp_path, hidden_act=act)
    ids = [Tokenizer(tmp_path).encode(text) for text in TEXTS]
    assert_parity(ModelRunner(tmp_path).embed(ids), hf_embeddings(reference, *padded_batch(ids)))


def test_cls_pooling_without_normalize_follows_the_sentence_transformers_files(tmp_path):
    reference = save_tiny_bert(tmp_path)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    pooling = {"pooling_mode_cls_token": True, "pooling_mode_mean_tokens": False}
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    ids = [Tokenizer(tmp_path).encode(text) for text in TEXTS]
    ours = ModelRunner(tmp_path).embed(ids)
    expected = hf_embeddings(reference, *padded_batch(ids), mode="cls", normalize=False)
    assert_parity(ours, expected)
    assert not torch.allclose(ours.norm(dim=-1), torch.ones(len(ids)))


def test_class_logits_are_transformers_pooler_and_classifier(tmp_path):
    reference = save_tiny_bert(tmp_path, model_class=BertForSequenceClassification, num_labels=3)
    ids = [Tokenizer(tmp_path).encode(text) for text in TEXTS]
    input_ids, mask = padded_batch(ids)
    with torch.no_grad():
        expected = reference(input_ids=input_ids, attention_mask=mask).logits
    runner = ModelRunner(tmp_path)
    assert runner.config.head == "classifier"
    assert_parity(runner.classify(ids), expected)


def test_a_checkpoint_with_the_bert_prefix_and_pretraining_heads_loads(tmp_path):
    reference = save_tiny_bert(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    prefixed = {f"bert.{name}": tensor for name, tensor in weights.items()}
    prefixed["cls.predictions.bias"] = torch.zeros(reference.config.vocab_size)
    save_file(prefixed, tmp_path / "model.safetensors")
    ids = [Tokenizer(tmp_path).encode(text) for text in TEXTS]
    assert_parity(ModelRunner(tmp_path).embed(ids), hf_embeddings(reference, *padded_batch(ids)))


def test_a_missing_tensor_is_named(tmp_path):
    save_tiny_bert(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["encoder.layer.1.output.LayerNorm.weight"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ContractError, match=r"lacks weights for layers\.1\.mlp_norm\.weight"):
        ModelRunner(tmp_path)


def test_an_encoder_cannot_be_served_for_text_generation(tmp_path):
    save_tiny_bert(tmp_path)
    settings = settings_from(parser().parse_args(["--model", str(tmp_path)]), {})
    with pytest.raises(ContractError) as err:
        load(settings, EngineMetrics())
    assert err.value.field == "model.task"
    assert "BertModel has no language-model head" in str(err.value)


def test_an_encoder_without_a_classifier_cannot_classify(encoder):
    _, runner, ids = encoder
    with pytest.raises(ContractError, match="^model.task: BertModel has no classification head"):
        runner.classify(ids)


def test_an_unsupported_model_type_fails_at_load_naming_model_type(tmp_path):
    save_tiny_bert(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"model_type": "t5"}))
    with pytest.raises(ContractError) as err:
        ModelRunner(tmp_path)
    assert err.value.field == "model_type"
    known = ", ".join(sorted(MODEL_TYPES))  # the message lists every family it reads
    assert f"'t5' is not supported; known: {known}" in str(err.value)
