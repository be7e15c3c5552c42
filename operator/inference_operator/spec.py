"""An InferenceService's spec, read into typed values with the contract's defaults.

The CRD's schema already checks and defaults everything; the operator reads
the spec again because it must never crash on an object stored before a CRD
change, or applied where the CRD lacks defaults. A bad field becomes a
`ContractError` naming it, which the handlers turn into a condition and a
permanent error.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from infergrid.codec import expect, field, integer, join, one_of
from infergrid.constants import DEFAULT_POLICY, PLACEMENT_POLICIES, TOPOLOGIES
from infergrid.errors import ContractError
from infergrid.gpu_models import GpuConstraint, check_models, parse_capability
from infergrid.runtimes import RUNTIMES, Runtime, check_settings, read_runtime
from infergrid.serving_config import FORMATS, TASKS, read_crd_engine
from infergrid.storage_uri import parse_storage_uri
from infergrid.tracks import MAX_NAME_WITH_CANARY

from .claims import Claim, read_claims
from .priority_classes import check_priority_class

MIG_PROFILE = re.compile(r"^[1-7]g\.[0-9]+gb$")
# How long a model may take to load (spec.model.loadTimeoutSeconds): bounds and default.
LOAD_TIMEOUT_S = (30, 7200, 600)

# The storage a runtime other than the bundled engine reads its model from: a path.
PATH_SCHEMES = ("pvc", "file")
# Where a CPU-only service's pods go unless spec.scheduling.schedulerName says otherwise.
CPU_SCHEDULER = "default-scheduler"


@dataclass(frozen=True, slots=True)
class Model:
    name: str
    storage_uri: str
    format: str = FORMATS[0]
    task: str = TASKS[0]
    load_timeout_s: int = LOAD_TIMEOUT_S[2]


@dataclass(frozen=True, slots=True)
class Resources:
    """At most one of `gpus`, `gpu_memory_mib`, `mig_profile` or `claims` (GPUs by DRA
    ResourceClaim, claims.py) is set; none makes a CPU-only service, whose pods the default
    scheduler places with no GPU involved."""

    gpus: int | None = None
    gpu_memory_mib: int | None = None
    gpu_cores: int | None = None
    mig_profile: str | None = None
    topology: str | None = None
    cpu: str | None = None
    memory: str | None = None
    gpu_constraint: GpuConstraint = GpuConstraint()
    claims: tuple[Claim, ...] = ()

    @property
    def cpu_only(self) -> bool:
        devices = (self.gpus, self.gpu_memory_mib, self.mig_profile)
        return all(d is None for d in devices) and not self.claims


@dataclass(frozen=True, slots=True)
class Scheduling:
    policy: str
    scheduler_name: str
    priority_class_name: str = ""
    # As in a PodSpec (key, operator, value, effect, tolerationSeconds), checked field by field.
    tolerations: tuple[dict[str, Any], ...] = ()
    # Node labels the pods need, as a PodSpec's nodeSelector.
    node_selector: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Autoscaling:
    enabled: bool = False
    min_replicas: int = 1
    max_replicas: int = 4
    target_queue_depth: int = 8
    target_p99_latency_ms: int = 500
    target_gpu_utilization: int = 80
    tolerance_percent: int = 10
    scale_down_stabilization_s: int = 300
    scale_down_max_percent: int = 20
    warm_pool: int = 0
    interval_s: int = 15


@dataclass(frozen=True, slots=True)
class Canary:
    storage_uri: str
    traffic_percent: int


@dataclass(frozen=True, slots=True)
class Network:
    """Who besides the gateway may call the engines (engine_access.py)."""

    allow_same_namespace: bool = False


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    model: Model
    image: str
    engine: Mapping[str, Any]  # spec.engine by key, defaulted: what the engine's file gets
    resources: Resources
    scheduling: Scheduling
    replicas: int
    autoscaling: Autoscaling
    canary: Canary | None
    network: Network = Network()
    runtime: Runtime = RUNTIMES["infergrid"]


def parse_spec(
    doc: object,
    default_image: str,
    default_scheduler: str,
    priority_classes: Collection[str] = (),
    *,
    name: str = "",
    runtime_images: Mapping[str, str] | None = None,
) -> ServiceSpec:
    """The spec of an InferenceService; the defaults fill what the CRD did not.

    priority_classes are those the operator allows (its allowedPriorityClasses); name is the
    service's metadata.name, which bounds whether it may have a canary; runtime_images are
    the operator's images of the other runtimes (its runtimeImages).
    """
    doc = expect(doc, dict, "spec")
    engine = field(doc, "engine", dict, "spec", {})
    runtime = read_runtime(doc)
    if runtime.args is not None:  # not the bundled engine: its image is the runtime's own
        default_image = _runtime_image(engine, runtime.name, runtime_images or {})
    engine_settings = read_crd_engine(engine, "spec.engine")
    check_settings(runtime, engine_settings)
    resources = _resources(field(doc, "resources", dict, "spec"))
    if resources.cpu_only:  # no GPU to place: kube-scheduler's own profile does it
        default_scheduler = CPU_SCHEDULER
    service = ServiceSpec(
        model=_model(field(doc, "model", dict, "spec")),
        image=field(engine, "image", str, "spec.engine", default_image),
        engine=engine_settings,
        resources=resources,
        scheduling=_scheduling(
            field(doc, "scheduling", dict, "spec", {}), default_scheduler, priority_classes
        ),
        replicas=integer(doc, "replicas", "spec", low=0, high=1000, default=1),
        autoscaling=_autoscaling(field(doc, "autoscaling", dict, "spec", {})),
        canary=_canary(doc.get("canary"), name),
        network=_network(field(doc, "network", dict, "spec", {})),
        runtime=runtime,
    )
    _check_runtime_storage(service)
    return service


def _runtime_image(engine: Mapping[str, Any], runtime: str, images: Mapping[str, str]) -> str:
    """spec.engine.image, else the operator's image of the runtime; neither is refused."""
    if engine.get("image") is None and runtime not in images:
        raise ContractError(
            "spec.engine.image",
            f"is required: this operator has no image of the {runtime} runtime (runtimeImages)",
        )
    return field(engine, "image", str, "spec.engine", images.get(runtime))


def _check_runtime_storage(spec: ServiceSpec) -> None:
    """A runtime other than the bundled engine reads a path: its model and canary come from
    a claim or the image's files (pkg:// models are the bundled engine's packages, and hf://
    needs its cache layout); llama.cpp's is one GGUF file."""
    if spec.runtime.args is None:
        return
    uris = [("spec.model.storageUri", spec.model.storage_uri)]
    if spec.canary is not None:
        uris.append(("spec.canary.storageUri", spec.canary.storage_uri))
    for path, uri in uris:
        scheme = uri.partition("://")[0]
        if scheme not in PATH_SCHEMES:
            raise ContractError(
                path, f"the {spec.runtime.name} runtime reads pvc:// or file:// paths, got {uri}"
            )
        if spec.runtime.model_file and not uri.endswith(".gguf"):
            raise ContractError(
                path, f"the {spec.runtime.name} runtime loads a .gguf file, got {uri}"
            )


def _model(doc: dict[str, Any]) -> Model:
    path = "spec.model"
    low, high, default = LOAD_TIMEOUT_S
    return Model(
        name=field(doc, "name", str, path),
        storage_uri=_uri(doc, path),
        format=one_of(doc, "format", FORMATS, path, FORMATS[0]),
        task=one_of(doc, "task", TASKS, path, TASKS[0]),
        load_timeout_s=integer(doc, "loadTimeoutSeconds", path, low, high, default),
    )


def _resources(doc: dict[str, Any]) -> Resources:
    path = "spec.resources"
    given = [key for key in ("gpus", "gpuMemoryMiB", "migProfile") if doc.get(key) is not None]
    if len(given) > 1:
        raise ContractError(path, f"set at most one of gpus, gpuMemoryMiB, migProfile; got {given}")
    if given and doc.get("claims"):
        raise ContractError(
            join(path, "claims"),
            f"GPUs come by device plugin ({given[0]}) or by claim, not both: set one",
        )
    resources = Resources(
        gpus=_optional(doc, "gpus", path, 1, 8),
        gpu_memory_mib=_optional(doc, "gpuMemoryMiB", path, 256, 1048576),
        gpu_cores=_optional(doc, "gpuCores", path, 1, 100),
        mig_profile=_mig_profile(doc, path),
        topology=one_of(doc, "topology", TOPOLOGIES, path, None),
        cpu=field(doc, "cpu", str, path, None),
        memory=field(doc, "memory", str, path, None),
        gpu_constraint=_gpu_constraint(doc, path),
        claims=read_claims(doc, path),
    )
    if resources.claims and not resources.gpu_constraint.empty:
        key = "gpuModels" if resources.gpu_constraint.models else "minComputeCapability"
        raise ContractError(
            join(path, key), "is not allowed with claims: a claim's DeviceClass picks its devices"
        )
    if resources.gpu_cores is not None and resources.gpu_memory_mib is None:
        raise ContractError(join(path, "gpuCores"), "is only allowed with gpuMemoryMiB")
    if resources.topology is not None and (resources.gpus or 0) < 2:
        raise ContractError(
            join(path, "topology"),
            "is only allowed with gpus >= 2",
        )
    if resources.cpu_only and not resources.gpu_constraint.empty:
        key = "gpuModels" if resources.gpu_constraint.models else "minComputeCapability"
        raise ContractError(join(path, key), "is only allowed with a GPU resource")
    return resources


def _gpu_constraint(doc: dict[str, Any], path: str) -> GpuConstraint:
    models = field(doc, "gpuModels", list, path, None)
    least = field(doc, "minComputeCapability", str, path, None)
    return GpuConstraint(
        models=() if models is None else check_models(models, join(path, "gpuModels")),
        min_capability=None
        if least is None
        else parse_capability(least, join(path, "minComputeCapability")),
    )


def _mig_profile(doc: dict[str, Any], path: str) -> str | None:
    profile = field(doc, "migProfile", str, path, None)
    if profile is not None and not MIG_PROFILE.match(profile):
        raise ContractError(
            join(path, "migProfile"), f"{profile!r} is not a MIG profile like 1g.10gb"
        )
    return profile


def _scheduling(
    doc: dict[str, Any], default_scheduler: str, priority_classes: Collection[str]
) -> Scheduling:
    path = "spec.scheduling"
    return Scheduling(
        policy=one_of(doc, "policy", PLACEMENT_POLICIES, path, DEFAULT_POLICY),
        scheduler_name=field(doc, "schedulerName", str, path, default_scheduler),
        priority_class_name=_priority_class(doc, path, priority_classes),
        tolerations=tuple(
            _toleration(item, f"{path}.tolerations[{i}]")
            for i, item in enumerate(field(doc, "tolerations", list, path, []))
        ),
        node_selector=tuple(
            (key, expect(value, str, f"{path}.nodeSelector[{key}]"))
            for key, value in sorted(field(doc, "nodeSelector", dict, path, {}).items())
        ),
    )


TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _toleration(item: object, path: str) -> dict[str, Any]:
    """One toleration, with only the fields a PodSpec knows; Exists takes no value."""
    doc = expect(item, dict, path)
    unknown = sorted(set(doc) - {"key", "operator", "value", "effect", "tolerationSeconds"})
    if unknown:
        raise ContractError(join(path, str(unknown[0])), "is not a field of a toleration")
    toleration: dict[str, Any] = {}
    for key in ("key", "value"):
        if doc.get(key):
            toleration[key] = field(doc, key, str, path)
    toleration["operator"] = one_of(doc, "operator", TOLERATION_OPERATORS, path, "Equal")
    if effect := one_of(doc, "effect", TAINT_EFFECTS, path, None):
        toleration["effect"] = effect
    if doc.get("tolerationSeconds") is not None:
        toleration["tolerationSeconds"] = integer(doc, "tolerationSeconds", path, low=0)
    if toleration["operator"] == "Exists" and "value" in toleration:
        raise ContractError(join(path, "value"), "must be empty when operator is Exists")
    return toleration


def _priority_class(doc: dict[str, Any], path: str, allowed: Collection[str]) -> str:
    """ "" means none in the CRD; the codec refuses empty strings, so it is read apart."""
    value = doc.get("priorityClassName")
    name = expect(value, str, join(path, "priorityClassName")) if value else ""
    check_priority_class(name, allowed)
    return name


def _autoscaling(doc: dict[str, Any]) -> Autoscaling:
    path, d = "spec.autoscaling", Autoscaling()

    def whole(key: str, low: int, high: int, default: int) -> int:
        return integer(doc, key, path, low=low, high=high, default=default)

    scaling = Autoscaling(
        enabled=field(doc, "enabled", bool, path, d.enabled),
        min_replicas=whole("minReplicas", 0, 1000, d.min_replicas),
        max_replicas=whole("maxReplicas", 1, 1000, d.max_replicas),
        target_queue_depth=whole("targetQueueDepth", 1, 100000, d.target_queue_depth),
        target_p99_latency_ms=whole("targetP99LatencyMs", 1, 600000, d.target_p99_latency_ms),
        target_gpu_utilization=whole("targetGpuUtilization", 1, 100, d.target_gpu_utilization),
        tolerance_percent=whole("tolerancePercent", 0, 100, d.tolerance_percent),
        scale_down_stabilization_s=whole(
            "scaleDownStabilizationSeconds", 0, 3600, d.scale_down_stabilization_s
        ),
        scale_down_max_percent=whole("scaleDownMaxPercent", 1, 100, d.scale_down_max_percent),
        warm_pool=whole("warmPool", 0, 100, d.warm_pool),
        interval_s=whole("intervalSeconds", 1, 3600, d.interval_s),
    )
    if scaling.min_replicas > scaling.max_replicas:
        raise ContractError(join(path, "minReplicas"), "must be at most maxReplicas")
    return scaling


def _network(doc: dict[str, Any]) -> Network:
    path = "spec.network"
    unknown = sorted(set(doc) - {"allowSameNamespace"})
    if unknown:
        raise ContractError(join(path, unknown[0]), "is not a field of spec.network")
    return Network(field(doc, "allowSameNamespace", bool, path, False))


def _canary(doc: object, name: str) -> Canary | None:
    if doc is None:
        return None
    path = "spec.canary"
    if len(name) > MAX_NAME_WITH_CANARY:
        raise ContractError(
            path,
            f"is only allowed for a name of at most {MAX_NAME_WITH_CANARY} characters "
            f"({name!r} has {len(name)}): Kubernetes cuts longer pod names so that the "
            "gateway cannot tell the canary's pods from the stable ones",
        )
    doc = expect(doc, dict, path)
    return Canary(_uri(doc, path), integer(doc, "trafficPercent", path, low=0, high=100))


def _uri(doc: dict[str, Any], path: str) -> str:
    uri = field(doc, "storageUri", str, path)
    parse_storage_uri(uri, join(path, "storageUri"))
    return uri


def _optional(doc: dict[str, Any], key: str, path: str, low: int, high: int) -> int | None:
    return None if doc.get(key) is None else integer(doc, key, path, low=low, high=high)
