"""The packaged all-MiniLM-L6-v2 encoder, extracted and served end to end.

Our vectors are compared with transformers' BertModel on the same extracted files, tokenized
by transformers' own tokenizer, in one right-padded batch, mean-pooled over the real tokens and
L2-normalised: what the model's sentence-transformers files ask for.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, BertModel

from batching_engine.main import parser, settings_from
from batching_engine.model.derived_cache import CACHE_ENV
from batching_engine.model.pooling import read_pooling
from batching_engine.model_runner import ModelRunner
from batching_engine.model_source import resolve_model_dir
from batching_engine.tokenizer import Tokenizer
from tests.batching_engine.server_thread import ServerThread
from tests.batching_engine.tiny_bert import hf_embeddings

pytestmark = pytest.mark.timeout(300)
URI = "pkg://all-minilm-l6-v2"
TEXTS = [
    "A man is eating food.",
    "Hi",
    "The quick brown fox jumps over the lazy dog, " * 20,  # ~200 tokens: past 128
    "Embeddings map sentences to vectors; similar meanings land close together.",
]


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CACHE_ENV, str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def model_dir(cache_env) -> Path:
    return resolve_model_dir(URI)


@pytest.fixture(scope="module")
def expected(model_dir) -> torch.Tensor:
    batch = AutoTokenizer.from_pretrained(model_dir)(TEXTS, padding=True, return_tensors="pt")
    reference = BertModel.from_pretrained(model_dir).eval()
    return hf_embeddings(reference, batch["input_ids"], batch["attention_mask"])


def assert_parity(ours: torch.Tensor, expected: torch.Tensor) -> None:
    assert ours.shape == expected.shape == (len(TEXTS), 384)
    assert (ours - expected).abs().max() < 1e-5
    assert F.cosine_similarity(ours, expected).min() > 1 - 1e-4


def test_the_package_ships_a_mean_pooled_normalised_encoder(model_dir):
    assert read_pooling(model_dir).mode == "mean" and read_pooling(model_dir).normalize
    tokenizer = Tokenizer(model_dir)
    assert tokenizer.encode("hello world") == [101, 7592, 2088, 102]  # [CLS] ... [SEP]
    assert len(tokenizer.encode(TEXTS[2])) > 128  # tokenizer.json's own cut is not applied


def test_embeddings_equal_transformers_for_inputs_of_different_lengths(model_dir, expected):
    tokenizer = Tokenizer(model_dir)
    ours = ModelRunner(model_dir).embed([tokenizer.encode(text) for text in TEXTS])
    assert_parity(ours, expected)


def post(url: str, body: Any) -> tuple[int, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


@pytest.fixture(scope="module")
def served(cache_env):
    args = parser().parse_args(["--model", URI, "--task", "embedding"])
    with ServerThread(settings_from(args, {})) as server:
        yield server


def test_the_server_returns_transformers_vectors(served, model_dir, expected):
    status, doc = post(served.url + "/v1/embeddings", {"input": TEXTS})
    assert status == 200 and doc["model"] == "all-minilm-l6-v2"
    assert_parity(torch.tensor([d["embedding"] for d in doc["data"]]), expected)
    tokens = sum(len(Tokenizer(model_dir).encode(text)) for text in TEXTS)
    assert doc["usage"]["prompt_tokens"] == tokens


def test_token_id_inputs_are_embedded_as_given(served, model_dir, expected):
    ids = [Tokenizer(model_dir).encode(text) for text in TEXTS]
    status, doc = post(served.url + "/v1/embeddings", {"input": ids})
    assert status == 200
    assert_parity(torch.tensor([d["embedding"] for d in doc["data"]]), expected)


def test_an_input_past_512_positions_gets_a_400_naming_it(served):
    status, doc = post(served.url + "/v1/embeddings", {"input": ["ok", "word " * 600]})
    assert status == 400 and doc["error"]["param"] == "input[1]"
    assert doc["error"]["message"] == "input[1]: needs 1 to 512 tokens, got 602"
