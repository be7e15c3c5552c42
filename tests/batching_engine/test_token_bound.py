"""A character count proves a text too long only for tokenizers that keep its characters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import normalizers, pre_tokenizers

from batching_engine.token_bound import _byte_symbols, token_bound
from batching_engine.tokenizer import Tokenizer
from harness.tiny_model_dir import CORPUS, write_bpe_tokenizer
from tests.batching_engine.tiny_bert import write_wordpiece_tokenizer


@pytest.fixture(scope="module")
def byte_level(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bpe")
    write_bpe_tokenizer(path, CORPUS, vocab_size=320)
    return path


def doc(tokenizer: HFTokenizer) -> dict[str, Any]:
    return json.loads(tokenizer.to_str())


def test_a_byte_level_bpe_is_bounded_by_its_longest_token(byte_level: Path) -> None:
    tokenizer = doc(HFTokenizer.from_file(str(byte_level / "tokenizer.json")))
    longest = max(
        [len(s) for s in tokenizer["model"]["vocab"]]
        + [len(t["content"]) for t in tokenizer["added_tokens"]]
    )
    assert token_bound(tokenizer).max_chars == longest
    assert Tokenizer(byte_level).token_bound.max_chars == longest


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_no_text_has_fewer_tokens_than_its_length_over_the_bound(byte_level: Path, text: str):
    tokenizer = Tokenizer(byte_level)
    bound = tokenizer.token_bound
    assert bound is not None
    assert len(tokenizer.encode(text, add_special_tokens=False)) >= bound.least_tokens(text)


def test_a_bert_tokenizer_that_drops_whitespace_has_no_bound(tmp_path: Path) -> None:
    assert token_bound(doc(write_wordpiece_tokenizer(tmp_path))) is None


def test_a_normalizer_a_dropping_splitter_or_a_missing_byte_removes_the_bound(
    byte_level: Path,
) -> None:
    def variant(change: Any) -> object:
        tokenizer = HFTokenizer.from_file(str(byte_level / "tokenizer.json"))
        change(tokenizer)
        return token_bound(doc(tokenizer))

    def nfkc(t: HFTokenizer) -> None:
        t.normalizer = normalizers.NFKC()

    def removing_split(t: HFTokenizer) -> None:
        t.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(" ", "removed"), pre_tokenizers.ByteLevel()]
        )

    def keeping_split(t: HFTokenizer) -> None:
        t.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel()]
        )

    assert variant(nfkc) is None
    assert variant(removing_split) is None
    assert variant(keeping_split) is not None
    without_a_continuation = doc(HFTokenizer.from_file(str(byte_level / "tokenizer.json")))
    del without_a_continuation["model"]["vocab"]["Ģ"]  # byte 0x80, in every multi-byte char
    assert token_bound(without_a_continuation) is None


def test_a_special_token_that_swallows_whitespace_removes_the_bound(byte_level: Path) -> None:
    tokenizer = doc(HFTokenizer.from_file(str(byte_level / "tokenizer.json")))
    tokenizer["added_tokens"][0]["lstrip"] = True
    assert token_bound(tokenizer) is None


# SmolLM2's vocabulary lacks these bytes: six control characters, and the UTF-8 lead bytes
# of U+40000..U+BFFFF (and the bytes UTF-8 never uses).
SMOLLM2_MISSING = [0x04, 0x06, 0x13, 0x14, 0x16, 0x1D, 0xC0, 0xC1, 0xF1, 0xF2, *range(0xF5, 0x100)]


def without_bytes(byte_level: Path, missing: list[int]) -> HFTokenizer:
    tokenizer = doc(HFTokenizer.from_file(str(byte_level / "tokenizer.json")))
    symbols = _byte_symbols()
    gone = {symbols[b] for b in missing}
    vocab = tokenizer["model"]["vocab"]
    kept = [s for s in vocab if not set(s) & gone]
    tokenizer["model"]["vocab"] = {s: i for i, s in enumerate(kept)}
    tokenizer["model"]["merges"] = [
        m for m in tokenizer["model"]["merges"]
        if not set("".join(m) if isinstance(m, list) else m.replace(" ", "")) & gone
    ]  # fmt: skip
    return HFTokenizer.from_str(json.dumps(tokenizer))


def test_characters_of_a_byte_the_vocabulary_lacks_are_not_counted(byte_level: Path) -> None:
    tokenizer = without_bytes(byte_level, SMOLLM2_MISSING)
    bound = token_bound(doc(tokenizer))
    assert bound is not None
    assert bound.least_tokens("\x04" * 1000) == 0  # they may all vanish
    assert bound.least_tokens("\U00050000" * 1000) == 0
    assert bound.least_tokens("a" * bound.max_chars * 3) == 3
    assert bound.least_tokens("\U00030000") == 1  # lead byte F0 is there


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.sampled_from("ab \x04\x06é€\U00050000\U00090000\U00030000"),
               max_size=60))  # fmt: skip
def test_a_vocabulary_missing_bytes_still_never_over_counts(byte_level: Path, text: str) -> None:
    tokenizer = without_bytes(byte_level, SMOLLM2_MISSING)
    bound = token_bound(doc(tokenizer))
    assert bound is not None
    assert len(tokenizer.encode(text, add_special_tokens=False).ids) >= bound.least_tokens(text)
