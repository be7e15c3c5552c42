"""Rebuild an HF tokenizer (tokenizer.json, tokenizer_config.json) from a GGUF's vocabulary.

GGUF keeps a gpt2-style byte-level BPE as three arrays (tokens, token types, merges) plus the
name of llama.cpp's pre-tokenizer. The pre-tokenizer is the one piece not stored as data, so
it comes from a table; an unknown name fails rather than silently splitting text differently
from the model's training. A sentencepiece vocabulary (tokens and scores) is converted by
transformers, whose converter is the reference for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from infergrid.errors import ContractError

# llama.cpp token types.
_CONTROL, _USER_DEFINED = 3, 4


def _gpt2() -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _digits_then_gpt2() -> pre_tokenizers.PreTokenizer:
    """GPT-2's split after isolating every digit (StarCoder, SmolLM)."""
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


# tokenizer.ggml.pre -> the pre-tokenizer it names.
PRE_TOKENIZERS = {
    "default": _gpt2,
    "gpt-2": _gpt2,
    "smollm": _digits_then_gpt2,
    "starcoder": _digits_then_gpt2,
    "refact": _digits_then_gpt2,
}


def build_tokenizer(metadata: dict[str, Any], gguf_path: Path) -> Tokenizer:
    """The GGUF's tokenizer: a byte-level BPE (`gpt2`) rebuilt here, or a sentencepiece
    vocabulary (`llama`: Llama 2, Gemma) through transformers' own GGUF converter, which
    knows each architecture's normalizer and byte fallback; BOS added as the file says."""
    kind = metadata.get("tokenizer.ggml.model")
    if kind == "gpt2":
        tokenizer = _byte_level_bpe(metadata)
    elif kind == "llama":
        tokenizer = _sentencepiece(gguf_path)
    else:
        raise ContractError(
            "tokenizer.ggml.model", f"{kind!r} is not supported; known: gpt2, llama"
        )
    _add_bos(tokenizer, metadata)
    return tokenizer


def _sentencepiece(gguf_path: Path) -> Tokenizer:
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    architecture, vocabulary, _ = get_gguf_tokenizer(str(gguf_path))
    tokenizer, _ = convert_gguf_tokenizer(architecture, vocabulary)
    return tokenizer


def _byte_level_bpe(metadata: dict[str, Any]) -> Tokenizer:
    """A byte-level BPE tokenizer with the GGUF's vocabulary, merges and special tokens."""
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise ContractError("tokenizer.ggml.pre", f"{pre!r} is not supported; known: {known}")
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    merges = [tuple(merge.split(" ", 1)) for merge in metadata.get("tokenizer.ggml.merges", [])]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    tokenizer.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_tokens(_added_tokens(metadata, tokens))
    return tokenizer


def _add_bos(tokenizer: Tokenizer, metadata: dict[str, Any]) -> None:
    """Encoding starts with BOS when the file says so (`add_bos_token`)."""
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    bos = metadata.get("tokenizer.ggml.bos_token_id")
    if metadata.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{tokens[bos]} $A",
            pair=f"{tokens[bos]} $A $B",
            special_tokens=[(tokens[bos], bos)],
        )


def _added_tokens(metadata: dict[str, Any], tokens: list[str]) -> list[AddedToken]:
    """Control tokens become special (never split, skipped when decoding); user-defined ones
    are kept whole but decoded as text."""
    types = metadata.get("tokenizer.ggml.token_type", [])
    return [
        AddedToken(tokens[index], special=kind == _CONTROL, normalized=False)
        for index, kind in enumerate(types)
        if kind in (_CONTROL, _USER_DEFINED)
    ]


def tokenizer_config(metadata: dict[str, Any]) -> dict[str, Any]:
    """tokenizer_config.json: special tokens by text, the chat template, the BOS rule."""
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]

    def token(key: str) -> str | None:
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[index] if index is not None and 0 <= index < len(tokens) else None

    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": token("bos"),
        "eos_token": token("eos"),
        "unk_token": token("unknown"),
        "pad_token": token("padding"),
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(metadata.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": metadata.get(f"{metadata.get('general.architecture')}.context_length"),
    }
    if "tokenizer.chat_template" in metadata:
        config["chat_template"] = metadata["tokenizer.chat_template"]
    return config
