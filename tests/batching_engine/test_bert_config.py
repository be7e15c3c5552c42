"""Reading a BERT config.json, picking the family by model_type, and refusals naming the field."""

from __future__ import annotations

import json

import pytest

from batching_engine.model.bert_config import BertConfig
from batching_engine.model.config import LlamaConfig, model_config_from_dir
from infergrid.errors import ContractError

MINILM = {
    "architectures": ["BertModel"],
    "model_type": "bert",
    "hidden_act": "gelu",
    "hidden_size": 384,
    "intermediate_size": 1536,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 512,
    "num_attention_heads": 12,
    "num_hidden_layers": 6,
    "position_embedding_type": "absolute",
    "type_vocab_size": 2,
    "vocab_size": 30522,
}


def test_shape_and_numerics_are_read():
    config = BertConfig.from_dict(MINILM)
    assert (config.head, config.head_dim, config.num_key_value_heads) == ("none", 32, 12)
    assert (config.layer_norm_eps, config.max_position_embeddings) == (1e-12, 512)
    assert (config.hidden_act, config.type_vocab_size, config.num_labels) == ("gelu", 2, 0)


def test_a_classifier_counts_its_labels():
    config = BertConfig.from_dict(
        MINILM | {"architectures": ["BertForSequenceClassification"], "id2label": {"0": "no"}}
    )
    assert (config.head, config.num_labels) == ("classifier", 1)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["BertForMaskedLM"]}, "^architectures: 'BertForMaskedLM' is not"),
        ({"hidden_act": "swish"}, "^hidden_act: 'swish' is not supported"),
        ({"position_embedding_type": "relative_key"}, "^position_embedding_type: 'relative_key'"),
        ({"is_decoder": True}, "^is_decoder: only a bidirectional encoder"),
        ({"add_cross_attention": True}, "^add_cross_attention: only a bidirectional encoder"),
        ({"num_attention_heads": 5}, "^num_attention_heads: 5 does not divide hidden_size 384"),
        ({"layer_norm_eps": 0}, "^layer_norm_eps: expected a positive number"),
        ({"architectures": ["BertForSequenceClassification"]}, "^id2label: a classification"),
    ],
)
def test_unsupported_configs_are_refused_naming_the_field(change, message):
    with pytest.raises(ContractError, match=message):
        BertConfig.from_dict(MINILM | change)


@pytest.mark.parametrize(
    ("raw", "family"),
    [
        (MINILM, BertConfig),
        (
            {
                "vocab_size": 8,
                "hidden_size": 8,
                "intermediate_size": 8,
                "num_hidden_layers": 1,
                "num_attention_heads": 2,
            },
            LlamaConfig,
        ),  # fmt: skip
    ],
)
def test_the_family_follows_model_type_and_llama_is_the_default(tmp_path, raw, family):
    (tmp_path / "config.json").write_text(json.dumps(raw))
    assert isinstance(model_config_from_dir(tmp_path), family)


def test_an_unknown_model_type_is_refused_naming_model_type(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MINILM | {"model_type": "t5"}))
    with pytest.raises(
        ContractError,
        match="^model_type: 't5' is not supported; known: bert, gemma2, gemma3_text, llama",
    ):
        model_config_from_dir(tmp_path)
