"""A character count proves a text too long only for tokenizers that keep every character."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import normalizers, pre_tokenizers

from batching_engine.token_bound import max_chars_per_token
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
    assert max_chars_per_token(tokenizer) == longest
    assert Tokenizer(byte_level).max_chars_per_token == longest


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60))
def test_no_text_has_fewer_tokens_than_its_length_over_the_bound(byte_level: Path, text: str):
    tokenizer = Tokenizer(byte_level)
    bound = tokenizer.max_chars_per_token
    assert bound is not None
    assert len(tokenizer.encode(text, add_special_tokens=False)) * bound >= len(text)


def test_a_bert_tokenizer_that_drops_whitespace_has_no_bound(tmp_path: Path) -> None:
    assert max_chars_per_token(doc(write_wordpiece_tokenizer(tmp_path))) is None


def test_a_normalizer_a_dropping_splitter_or_a_missing_byte_removes_the_bound(
    byte_level: Path,
) -> None:
    def variant(change: Any) -> int | None:
        tokenizer = HFTokenizer.from_file(str(byte_level / "tokenizer.json"))
        change(tokenizer)
        return max_chars_per_token(doc(tokenizer))

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
    without_a_byte = doc(HFTokenizer.from_file(str(byte_level / "tokenizer.json")))
    del without_a_byte["model"]["vocab"]["Ā"]
    assert max_chars_per_token(without_a_byte) is None


def test_a_special_token_that_swallows_whitespace_removes_the_bound(byte_level: Path) -> None:
    tokenizer = doc(HFTokenizer.from_file(str(byte_level / "tokenizer.json")))
    tokenizer["added_tokens"][0]["lstrip"] = True
    assert max_chars_per_token(tokenizer) is None
