"""The children of an InferenceService, rendered as plain manifests.

Every function here is pure: the same spec and operator settings give the same
dicts, so applying them again is a no-op and the handlers can re-apply from any
state. The handlers add the owner reference (kopf.adopt) and apply them.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any, Final

import yaml

from infergrid.constants import (
    ANNOTATION_PLACEMENT_POLICY,
    ANNOTATION_TOPOLOGY,
    LABEL_GPU_PRODUCT,
    LABEL_INFERENCESERVICE,
    RESOURCE_GPU,
    RESOURCE_GPU_CORES,
    RESOURCE_GPU_MEMORY,
    RESOURCE_VGPU,
    mig_resource,
)
from infergrid.errors import ContractError
from infergrid.gpu_models import constraint_annotations, node_affinity
from infergrid.serving_config import CONFIG_ENV, DEFAULT_PORT, ModelRef, encode
from infergrid.storage_uri import (
    ALLOW_DOWNLOAD_ENV,
    HF_HOME_ENV,
    HF_HOME_MOUNT,
    parse_storage_uri,
)
from infergrid.tracks import CANARY, STABLE, TRACKS, deployment_name

from .claims import container_claims, pod_claims, render_template, whole_gpus
from .engine_access import (
    NO_FENCES,
    EngineAccess,
    render_network_policy,
    render_token_secret,
    token_annotation,
    token_env,
    token_mount,
    token_volume,
)
from .spec import Resources, ServiceSpec

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_SERVICE = LABEL_INFERENCESERVICE  # the gateway selects the Service's EndpointSlices by it
LABEL_TRACK = "infergrid.io/track"
ENGINE_APP = "infergrid-engine"

ENGINE_PORT = DEFAULT_PORT
SERVICE_PORT = 80
CONFIG_DIR = "/etc/infergrid"
CONFIG_KEY = "engine.yaml"
CONFIG_HASH_LENGTH = 10
CONFIG_VOLUME = "engine-config"
HF_HOME_VOLUME = "hf-home"
# A pvc:// claim's volume: the prefix and a hash of the claim, a DNS label for any claim name.
CLAIM_VOLUME_PREFIX = "model-"
STARTUP_PERIOD_S = 5
# The engine image's user (images/components.py NONROOT); any image runs as it.
ENGINE_UID = 65532
# The one writable path outside the mounts: the image points its caches (HF_HOME,
# TRITON_CACHE_DIR, INFERGRID_CACHE_DIR) and temporary files here.
TMP_VOLUME = "tmp"
TMP_DIR = "/tmp"


@dataclass(frozen=True, slots=True)
class ModelStorage:
    """The operator's settings for weights outside the image, as plain data for rendering.

    `hf_cache_claim` names a claim (in the service's namespace) holding an HF_HOME-layout
    cache; `allow_download` lets the engine download what the cache lacks.
    """

    hf_cache_claim: str = ""
    allow_download: bool = False


@dataclass(frozen=True, slots=True)
class TrackStorage:
    """What one track's storage URI adds to its pod: volumes, engine mounts and env."""

    volumes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
    env: tuple[dict[str, str], ...] = ()


# A CPU-only service's pods prefer nodes without GPUs (no device plugin labelled them), and
# take a GPU node's CPUs only where no other node has room.
AWAY_FROM_GPU_NODES: Final = {
    "preferredDuringSchedulingIgnoredDuringExecution": [
        {
            "weight": 100,
            "preference": {
                "matchExpressions": [{"key": LABEL_GPU_PRODUCT, "operator": "DoesNotExist"}]
            },
        }
    ]
}


def configmap_name(spec: ServiceSpec, name: str, track: str) -> str:
    """`<name>-<track>-<hash of the config>`: a new name for every new config, so a config
    is never changed under the pods that run it (see configmap_gc)."""
    return f"{name}-{track}-{config_hash(spec, track)}"


def config_hash(spec: ServiceSpec, track: str) -> str:
    text = _dump(engine_config(spec, track))
    return hashlib.sha256(text.encode()).hexdigest()[:CONFIG_HASH_LENGTH]


def pod_labels(name: str, track: str) -> dict[str, str]:
    return {
        LABEL_NAME: ENGINE_APP,
        LABEL_INSTANCE: name,
        LABEL_SERVICE: name,
        LABEL_TRACK: track,
    }


def stable_selector(name: str) -> str:
    """The scale subresource's selector: the stable pods, those spec.replicas counts."""
    return f"{LABEL_SERVICE}={name},{LABEL_TRACK}={STABLE}"


def service_url(name: str, namespace: str) -> str:
    return f"http://{name}.{namespace}.svc.cluster.local"


def track_replicas(spec: ServiceSpec) -> dict[str, int]:
    """Replicas per track; the Service sends each ready pod an equal share of requests.

    spec.replicas counts stable pods. A canary with P percent gets the count
    that makes its share of all pods closest to P, and at least one pod while
    P > 0, since a canary that should take traffic needs a pod to take it.
    At 100 percent the canary takes all the replicas and stable keeps none.
    """
    stable, canary = spec.replicas, spec.canary
    if canary is None:
        return {STABLE: stable}
    percent = canary.traffic_percent
    if percent == 100:
        return {STABLE: 0, CANARY: stable}
    count = math.floor(stable * percent / (100 - percent) + 0.5)
    if percent > 0 and stable > 0:
        count = max(count, 1)
    return {STABLE: stable, CANARY: count}


def track_uri(spec: ServiceSpec, track: str) -> tuple[str, str]:
    """The storage URI one track serves, and the spec field it comes from."""
    if track == CANARY and spec.canary:
        return spec.canary.storage_uri, "spec.canary.storageUri"
    return spec.model.storage_uri, "spec.model.storageUri"


def engine_config(spec: ServiceSpec, track: str) -> dict[str, Any]:
    """What the engine reads from INFERGRID_ENGINE_CONFIG: its model and batching settings,
    and one tensor-parallel rank per whole GPU of the replica, claimed or not (1 for a share
    or a MIG slice)."""
    model = spec.model
    uri, _ = track_uri(spec, track)
    ranks = spec.resources.gpus or whole_gpus(spec.resources.claims) or 1
    engine = {**spec.engine, "tensorParallelSize": ranks}
    return encode(ModelRef(model.name, uri, model.format, model.task), engine, ENGINE_PORT)


def render_configmap(spec: ServiceSpec, name: str, namespace: str, track: str) -> dict[str, Any]:
    """One track's config, immutable: a changed config is a new ConfigMap, rolled out by
    the Deployment whose pod template names it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": configmap_name(spec, name, track), "namespace": namespace,
                     "labels": pod_labels(name, track)},
        "immutable": True,
        "data": {CONFIG_KEY: _dump(engine_config(spec, track))},
    }  # fmt: skip


def render_deployment(
    spec: ServiceSpec,
    name: str,
    namespace: str,
    track: str = STABLE,
    storage: ModelStorage = ModelStorage(),
    access: EngineAccess = NO_FENCES,
) -> dict[str, Any]:
    """Engine pods of one track; maxSurge 0, since a surge pod would need a spare GPU.

    Each label map is its own dict: kopf.adopt adds the owner's labels to the
    Deployment's metadata, and they must not leak into the immutable selector.
    """
    extras = track_storage(spec, track, storage)
    annotations = _pod_annotations(spec)
    if access.token_key:
        extras = with_engine_token(extras, name)
        annotations |= token_annotation(name, namespace, access.token_key)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": deployment_name(name, track), "namespace": namespace,
                     "labels": pod_labels(name, track)},
        "spec": {
            "replicas": track_replicas(spec)[track],
            "selector": {"matchLabels": pod_labels(name, track)},
            "strategy": {"type": "RollingUpdate",
                         "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": pod_labels(name, track), "annotations": annotations},
                "spec": _pod_spec(spec, name, track, extras),
            },
        },
    }  # fmt: skip


def render_service(spec: ServiceSpec, name: str, namespace: str) -> dict[str, Any]:
    """Selects both tracks: traffic splits by the share of ready pods each track has."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
        "spec": {
            "selector": {LABEL_SERVICE: name},
            "ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": "http",
                       "protocol": "TCP"}],
        },
    }  # fmt: skip


def render_pdb(spec: ServiceSpec, name: str, namespace: str) -> dict[str, Any]:
    """At most one engine pod evicted at a time, the same budget a rollout takes."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": namespace, "labels": _labels(name)},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {LABEL_SERVICE: name}}},
    }


def render_children(
    spec: ServiceSpec,
    name: str,
    namespace: str,
    storage: ModelStorage = ModelStorage(),
    access: EngineAccess = NO_FENCES,
) -> list[dict[str, Any]]:
    """Every child; the ConfigMaps, the claim templates, the token Secret and the
    NetworkPolicy come before the Deployments, so that no pod starts without its config,
    its GPUs' claims, its token or its fence."""
    tracks = track_replicas(spec)
    fences = []
    if access.token_key:
        fences.append(render_token_secret(name, namespace, access.token_key, _labels(name)))
    if access.network_policy:
        same_namespace = spec.network.allow_same_namespace
        fences.append(render_network_policy(name, namespace, access, same_namespace,
                                            _labels(name)))  # fmt: skip
    return [
        *(render_configmap(spec, name, namespace, t) for t in tracks),
        *(render_template(name, namespace, c, _labels(name)) for c in spec.resources.claims),
        *fences,
        *(render_deployment(spec, name, namespace, t, storage, access) for t in tracks),
        render_service(spec, name, namespace),
        render_pdb(spec, name, namespace),
    ]


def stale_deployments(spec: ServiceSpec, name: str) -> list[str]:
    """Deployments of tracks the spec no longer has: the canary once it is removed."""
    return [deployment_name(name, t) for t in TRACKS if t not in track_replicas(spec)]


def check_storage(spec: ServiceSpec, storage: ModelStorage) -> None:
    """A ContractError naming the field of any track whose weights these settings cannot reach."""
    for track in track_replicas(spec):
        track_storage(spec, track, storage)


def track_storage(spec: ServiceSpec, track: str, storage: ModelStorage) -> TrackStorage:
    """The volumes, mounts and env that let one track's engine read its weights.

    pvc:// mounts the claim read-only at its mount path; hf:// mounts the HF_HOME cache
    (the operator's hfCacheClaim, or an emptyDir to download into) and allows downloads
    only where the operator does. pkg:// and file:// need nothing.
    """
    uri, field = track_uri(spec, track)
    parsed = parse_storage_uri(uri, field)
    if parsed.scheme == "pvc":
        volume = claim_volume_name(parsed.name)
        return TrackStorage(
            volumes=(_claim_volume(volume, parsed.name, read_only=True),),
            mounts=(_mount(volume, parsed.mount_path, read_only=True),),
        )
    if parsed.scheme == "hf":
        return _hf_storage(uri, field, storage)
    return TrackStorage()


def with_engine_token(storage: TrackStorage, name: str) -> TrackStorage:
    """The pod's storage plus the service's token Secret and the variable naming its file."""
    return TrackStorage(
        volumes=(*storage.volumes, token_volume(name)),
        mounts=(*storage.mounts, token_mount()),
        env=(*storage.env, token_env()),
    )


def claim_volume_name(claim: str) -> str:
    """A DNS label for any claim name (up to 253 characters, dots included); never a name the
    pod's other volumes use, and the same for the same claim on every render."""
    return CLAIM_VOLUME_PREFIX + hashlib.sha256(claim.encode()).hexdigest()[:16]


def _hf_storage(uri: str, field: str, storage: ModelStorage) -> TrackStorage:
    claim, download = storage.hf_cache_claim, storage.allow_download
    if not claim and not download:
        raise ContractError(
            field,
            f"{uri!r}: hf:// needs the operator's hfCacheClaim setting (a claim holding an "
            "HF_HOME cache) or its allowModelDownload setting, and neither is set; ask the "
            "cluster admin, or use pvc:// or pkg://",
        )
    if claim:
        volume = _claim_volume(HF_HOME_VOLUME, claim, read_only=not download)
    else:
        volume = {"name": HF_HOME_VOLUME, "emptyDir": {}}
    env = [{"name": HF_HOME_ENV, "value": HF_HOME_MOUNT}]
    if download:
        env.append({"name": ALLOW_DOWNLOAD_ENV, "value": "true"})
    return TrackStorage(
        volumes=(volume,),
        mounts=(_mount(HF_HOME_VOLUME, HF_HOME_MOUNT, read_only=not download),),
        env=tuple(env),
    )


def _claim_volume(name: str, claim: str, read_only: bool) -> dict[str, Any]:
    source: dict[str, Any] = {"claimName": claim}
    if read_only:
        source["readOnly"] = True
    return {"name": name, "persistentVolumeClaim": source}


def _mount(name: str, path: str, read_only: bool) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": name, "mountPath": path}
    if read_only:
        mount["readOnly"] = True
    return mount


def gpu_limits(resources: Resources) -> dict[str, str]:
    """The extended resources of one engine container, as the device plugin advertises them;
    none for a CPU-only service or one whose GPUs come by claim (claims.py)."""
    if resources.cpu_only or resources.claims:
        return {}
    if resources.gpus is not None:
        return {RESOURCE_GPU: str(resources.gpus)}
    if resources.mig_profile is not None:
        return {mig_resource(resources.mig_profile): "1"}
    limits = {RESOURCE_VGPU: "1", RESOURCE_GPU_MEMORY: str(resources.gpu_memory_mib)}
    if resources.gpu_cores is not None:
        limits[RESOURCE_GPU_CORES] = str(resources.gpu_cores)
    return limits


def _pod_spec(spec: ServiceSpec, name: str, track: str, storage: TrackStorage) -> dict[str, Any]:
    """The engine runs tenant-chosen code next to a GPU: no API token, no root, no privilege."""
    config = {"name": CONFIG_VOLUME, "configMap": {"name": configmap_name(spec, name, track)}}
    pod: dict[str, Any] = {
        "schedulerName": spec.scheduling.scheduler_name,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "containers": [_container(spec, track, storage)],
        "volumes": [config, {"name": TMP_VOLUME, "emptyDir": {}}, *storage.volumes],
    }
    if spec.resources.claims:
        pod["resourceClaims"] = pod_claims(name, spec.resources.claims)
    if spec.scheduling.priority_class_name:
        pod["priorityClassName"] = spec.scheduling.priority_class_name
    if spec.scheduling.tolerations:
        pod["tolerations"] = [dict(t) for t in spec.scheduling.tolerations]
    if spec.scheduling.node_selector:
        pod["nodeSelector"] = dict(spec.scheduling.node_selector)
    affinity = node_affinity(spec.resources.gpu_constraint)
    if spec.resources.cpu_only:
        affinity = AWAY_FROM_GPU_NODES
    if affinity is not None:
        pod["affinity"] = {"nodeAffinity": affinity}
    return pod


def _container(spec: ServiceSpec, track: str, storage: TrackStorage) -> dict[str, Any]:
    """The engine container: the bundled engine reads the serving file the ConfigMap holds;
    another runtime gets its flags from the runtime table, and the track's model as a path."""
    requests = {k: v for k, v in (("cpu", spec.resources.cpu),
                                  ("memory", spec.resources.memory)) if v}  # fmt: skip
    limits = gpu_limits(spec.resources)
    resources: dict[str, Any] = {"limits": limits} if limits else {}
    if spec.resources.claims:
        resources = container_claims(spec.resources.claims)
        requests |= resources["requests"]
    if requests:
        resources["requests"] = requests
    runtime = spec.runtime
    env = [*storage.env]
    served: dict[str, Any] = {}
    if runtime.args is None:
        env.insert(0, {"name": CONFIG_ENV, "value": f"{CONFIG_DIR}/{CONFIG_KEY}"})
    else:
        uri, field = track_uri(spec, track)
        served["args"] = runtime.args(model_path(uri, field), spec.model.name, spec.engine)
        if runtime.command:
            served["command"] = list(runtime.command)
    return {
        "name": "engine",
        "image": spec.image,
        **served,
        "ports": [{"name": "http", "containerPort": runtime.port, "protocol": "TCP"}],
        "env": env,
        "resources": resources,
        "livenessProbe": _probe(runtime.live_path, period=10, failures=3),
        "readinessProbe": _probe(runtime.ready_path, period=5, failures=3),
        "startupProbe": startup_probe(spec.model.load_timeout_s, runtime.ready_path),
        "securityContext": container_security_context(),
        "volumeMounts": [
            _mount(CONFIG_VOLUME, CONFIG_DIR, read_only=True),
            _mount(TMP_VOLUME, TMP_DIR, read_only=False),
            *storage.mounts,
        ],
    }


def pod_security_context() -> dict[str, Any]:
    """The Pod Security Standard "restricted" profile's pod-level fields, with a fixed user."""
    return {
        "runAsNonRoot": True,
        "runAsUser": ENGINE_UID,
        "runAsGroup": ENGINE_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """No capabilities, no way to gain privileges, and nothing writable but /tmp and the mounts."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }


def startup_probe(load_timeout_s: int, path: str = "/readyz") -> dict[str, Any]:
    """The readiness path every 5 s, failing the pod only once the model had its whole load
    timeout."""
    failures = math.ceil(load_timeout_s / STARTUP_PERIOD_S)
    return _probe(path, period=STARTUP_PERIOD_S, failures=failures)


def model_path(uri: str, field: str) -> str:
    """Where a runtime other than the bundled engine finds the model: inside the claim the
    pod mounts for a pvc:// URI (as `track_storage` mounts it), or the file:// path."""
    parsed = parse_storage_uri(uri, field)
    if parsed.scheme == "pvc":
        return f"{parsed.mount_path}/{parsed.path}" if parsed.path else parsed.mount_path
    return parsed.name


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
    }


def _pod_annotations(spec: ServiceSpec) -> dict[str, str]:
    """Placement inputs for the extender; a CPU-only service's pods have none to give."""
    if spec.resources.cpu_only:
        return {}
    annotations = {ANNOTATION_PLACEMENT_POLICY: spec.scheduling.policy}
    if spec.resources.topology:
        annotations[ANNOTATION_TOPOLOGY] = spec.resources.topology
    return annotations | constraint_annotations(spec.resources.gpu_constraint)


def _labels(name: str) -> dict[str, str]:
    return {LABEL_NAME: ENGINE_APP, LABEL_INSTANCE: name, LABEL_SERVICE: name}


def _dump(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)
