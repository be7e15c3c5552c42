"""Reading a Llama config.json: both rope spellings, and refusals that name the field."""

from __future__ import annotations

import pytest

from batching_engine.model.config import LlamaConfig, RopeScaling
from infergrid.errors import ContractError

BASE = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5,
    "bos_token_id": 1,
    "eos_token_id": [2, 7],
}


def test_shape_numerics_and_special_tokens_are_read():
    config = LlamaConfig.from_dict(BASE)
    assert (config.head_dim, config.num_key_value_heads, config.rms_norm_eps) == (16, 2, 1e-5)
    assert (config.rope_theta, config.rope_scaling, config.head) == (10000.0, None, "lm_head")
    assert (config.bos_token_id, config.eos_token_ids, config.tie_word_embeddings) == (
        1,
        (2, 7),
        False,
    )


def test_transformers_5_rope_parameters_carry_theta_and_scaling():
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    config = LlamaConfig.from_dict(BASE | {"rope_parameters": rope})
    assert config.rope_theta == 500000.0
    assert config.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)


def test_the_older_rope_theta_and_rope_scaling_spelling_is_read_too():
    config = LlamaConfig.from_dict(
        BASE | {"rope_theta": 100000.0, "rope_scaling": {"type": "linear", "factor": 2.0}}
    )
    assert (config.rope_theta, config.rope_scaling) == (100000.0, RopeScaling("linear", 2.0))
    default = LlamaConfig.from_dict(
        BASE | {"rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
    )
    assert (default.rope_theta, default.rope_scaling) == (5e5, None)


def test_a_classifier_counts_its_labels():
    config = LlamaConfig.from_dict(
        BASE
        | {"architectures": ["LlamaForSequenceClassification"], "id2label": {"0": "a", "1": "b"}}
    )
    assert (config.head, config.num_labels) == ("score", 2)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"model_type": "gemma"},
            "^model_type: 'gemma' is not a decoder; known: gemma2, gemma3_text, llama",
        ),
        (
            {"architectures": ["Qwen2ForCausalLM"]},
            "^architectures: 'Qwen2ForCausalLM' is not supported; known: LlamaForCausalLM",
        ),
        (
            {"architectures": ["GPT2LMHeadModel"]},
            "^architectures: 'GPT2LMHeadModel' is not supported",
        ),
        ({"architectures": ["A", "B"]}, "^architectures: expected one"),
        (
            {"num_key_value_heads": 3},
            "^num_key_value_heads: 3 does not divide num_attention_heads 4",
        ),
        ({"hidden_size": 0}, "^hidden_size: expected a positive integer, got 0"),
        ({"vocab_size": None}, "^vocab_size: missing"),
        ({"hidden_act": "gelu"}, "^hidden_act: 'gelu' is not supported"),
        ({"mlp_bias": True}, "^mlp_bias: biases on the MLP are not supported"),
        (
            {"rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
            "^rope_parameters.rope_type: 'yarn' is not supported; known: default, linear, llama3",
        ),
        ({"rope_scaling": {"rope_type": "linear"}}, "^rope_scaling.factor: missing"),
        (
            {
                "rope_parameters": {
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 4.0,
                    "high_freq_factor": 1.0,
                    "original_max_position_embeddings": 64,
                }
            },
            "^rope_parameters.high_freq_factor: must exceed low_freq_factor",
        ),
        ({"eos_token_id": "</s>"}, "^eos_token_id: expected a token id or a list of them"),
        (
            {"architectures": ["LlamaForSequenceClassification"]},
            "^id2label: a classification model needs",
        ),
    ],
)
def test_configs_the_model_code_cannot_honour_are_refused_by_field(change, message):
    with pytest.raises(ContractError, match=message):
        LlamaConfig.from_dict(BASE | change)


def test_a_directory_without_config_json_is_refused(tmp_path):
    with pytest.raises(ContractError, match="^model_dir: .*config.json does not exist"):
        LlamaConfig.from_dir(tmp_path)
