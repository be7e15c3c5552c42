"""The fewest tokens a text can have, where a tokenizer lets us prove it.

Tokenizing megabytes takes seconds, so a prompt that is certainly too long is refused by
its character count first: if no token covers more than `max_chars` bytes, the characters
that surely end up inside tokens make at least (their count) / max_chars tokens. We can
prove which characters do for one shape, the byte-level BPE of GPT-2, Llama 3 and SmolLM2:
no normalizer, a ByteLevel pre-tokenizer (alone or after splitters that keep what they
split), and no special token that swallows the whitespace beside it. Then every byte of the
text becomes a symbol, and a symbol in the vocabulary ends up in a token; a token of k
symbols covers k bytes, and a character is one byte or more.

A vocabulary may lack some byte symbols (SmolLM2's lacks six control characters and the
UTF-8 lead bytes F1 and F2): the characters holding such a byte may vanish, so they are not
counted (`uncovered`). A missing continuation byte (80-BF) would leave too many characters
in doubt, and any other tokenizer (one that strips accents or whitespace, or maps an
unknown word to one [UNK]) gets None: no early refusal, only the count after tokenizing.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

_KEEPING_SPLITTERS: Final = frozenset({"Split", "Digits", "Punctuation"})
_CONTINUATION: Final = range(0x80, 0xC0)
_NEVER_IN_UTF8: Final = frozenset({0xC0, 0xC1, *range(0xF5, 0x100)})


@dataclass(frozen=True, slots=True)
class TokenBound:
    """At least `least_tokens(text)` tokens, for a tokenizer of the provable shape."""

    max_chars: int
    uncovered: re.Pattern[str] | None
    """Characters holding a byte the vocabulary lacks: they may make no token."""

    def least_tokens(self, text: str) -> int:
        covered = len(text) if self.uncovered is None else len(self.uncovered.sub("", text))
        return -(-covered // self.max_chars)


def token_bound(doc: Mapping[str, Any]) -> TokenBound | None:
    """`doc` is tokenizer.json; None unless the count of its tokens can be bounded."""
    model = doc.get("model") or {}
    vocab = model.get("vocab")
    if doc.get("normalizer") is not None or model.get("type") != "BPE":
        return None
    if not isinstance(vocab, Mapping) or not _byte_level(doc.get("pre_tokenizer")):
        return None
    added = doc.get("added_tokens") or []
    if any(token.get("lstrip") or token.get("rstrip") for token in added):
        return None  # a special token that swallows the whitespace beside it has no bound
    missing = {b for b, symbol in enumerate(_byte_symbols()) if symbol not in vocab}
    if missing & set(_CONTINUATION):
        return None
    longest = max([len(symbols) for symbols in vocab] + [len(t.get("content", "")) for t in added])
    return TokenBound(longest, _uncovered(missing - _NEVER_IN_UTF8))


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


def _byte_symbols() -> list[str]:
    """The symbol ByteLevel writes for each byte value: printable Latin-1 bytes stand for
    themselves, the others take the code points from 256 up, in byte order."""
    kept = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(shifted)) for b in range(256)]


def _uncovered(lead_bytes: set[int]) -> re.Pattern[str] | None:
    """A character class of every character whose UTF-8 form starts with one of
    `lead_bytes` (ASCII bytes are characters of their own)."""
    ranges = [_code_points(b) for b in sorted(lead_bytes)]
    if not ranges:
        return None
    spans = "".join(f"{re.escape(chr(a))}-{re.escape(chr(z))}" for a, z in ranges)
    return re.compile(f"[{spans}]")


def _code_points(lead: int) -> tuple[int, int]:
    """The code points whose UTF-8 encoding starts with byte `lead`."""
    for low, high, mask, shift in _LEADS:
        if low <= lead <= high:
            first = (lead & mask) << shift
            return first, min(first + (1 << shift) - 1, 0x10FFFF)
    raise ValueError(f"{lead:#x} starts no UTF-8 character")


_LEADS: Final = ((0x00, 0x7F, 0x7F, 0), (0xC2, 0xDF, 0x1F, 6), (0xE0, 0xEF, 0x0F, 12),
                 (0xF0, 0xF4, 0x07, 18))  # fmt: skip
"""(first lead byte, last, bits of the code point it holds, bits that follow)."""
