"""The most characters one token can cover, where a tokenizer lets us prove it.

Tokenizing megabytes takes seconds, so a prompt that is certainly too long is refused by
its character count first: if no token covers more than `bound` characters, a text of n
characters has at least n / bound tokens. That holds only when every character of the
text ends up inside some token, which we can prove for one shape, the byte-level BPE of
GPT-2, Llama 3 and SmolLM2: no normalizer, a ByteLevel pre-tokenizer (alone or after
splitters that keep what they split), and a vocabulary holding all 256 byte symbols, so
every byte is a token's, and no special token swallows the whitespace beside it. Each
character is one byte or more, and a token of k symbols
covers k bytes. Any other tokenizer (one that strips accents or whitespace, or maps an
unknown word to one [UNK]) gets None: no early refusal, only the count after tokenizing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from tokenizers import pre_tokenizers

_KEEPING_SPLITTERS: Final = frozenset({"Split", "Digits", "Punctuation"})
_BYTE_SYMBOLS: Final = frozenset(pre_tokenizers.ByteLevel.alphabet())


def max_chars_per_token(doc: Mapping[str, Any]) -> int | None:
    """`doc` is tokenizer.json; None unless every character is provably in a token."""
    model = doc.get("model") or {}
    vocab = model.get("vocab")
    if doc.get("normalizer") is not None or model.get("type") != "BPE":
        return None
    if not isinstance(vocab, Mapping) or not _BYTE_SYMBOLS <= vocab.keys():
        return None
    if not _byte_level(doc.get("pre_tokenizer")):
        return None
    added = doc.get("added_tokens") or []
    if any(token.get("lstrip") or token.get("rstrip") for token in added):
        return None  # a special token that swallows the whitespace beside it has no bound
    return max([len(symbols) for symbols in vocab] + [len(t.get("content", "")) for t in added])


def _byte_level(pre: Any) -> bool:
    """A ByteLevel pre-tokenizer, after nothing but splitters that drop no characters."""
    steps = (pre.get("pretokenizers") or []) if _kind(pre) == "Sequence" else [pre]
    if not steps or _kind(steps[-1]) != "ByteLevel":
        return False
    return all(
        _kind(step) in _KEEPING_SPLITTERS and step.get("behavior") != "Removed"
        for step in steps[:-1]
    )


def _kind(step: Any) -> str | None:
    return step.get("type") if isinstance(step, Mapping) else None
