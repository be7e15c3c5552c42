"""A complete tiny model directory for serving tests: random Llama weights and a tokenizer.

The tokenizer is a byte-level BPE trained on the spot with ChatML special tokens (so the
engine's ChatML fallback template works); the model's vocabulary is sized to it. Both are
random but fixed by seeds, so greedy output is the same on every run.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from harness.tiny_llama import save_tiny_llama

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_TOKEN = "<|im_end|>"
CORPUS = [
    "you are a helpful assistant. answer briefly and politely.",
    "hello world, the quick brown fox jumps over the lazy dog",
    "what is the capital of france? paris is the capital of france.",
] * 10
MAX_POSITIONS = 256


def write_bpe_tokenizer(
    path: Path, corpus: list[str], vocab_size: int, tokenizer_config: dict | None = None
) -> HFTokenizer:
    """A byte-level BPE with ChatML special tokens trained on `corpus`, saved in `path` with a
    tokenizer_config.json naming ChatML's BOS and EOS (`tokenizer_config` adds or overrides)."""
    tokenizer = HFTokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus, trainer)
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"eos_token": EOS_TOKEN, "bos_token": "<|im_start|>"} | (tokenizer_config or {})
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return tokenizer


def write_tiny_model(path: Path, seed: int = 0, max_positions: int = MAX_POSITIONS) -> Path:
    """An HF-format directory at `path`: config.json, safetensors, tokenizer files."""
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = write_bpe_tokenizer(path, CORPUS, vocab_size=320)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    save_tiny_llama(
        path,
        seed=seed,
        vocab_size=tokenizer.get_vocab_size(),
        max_position_embeddings=max_positions,
        eos_token_id=eos_id,
    )
    return path
