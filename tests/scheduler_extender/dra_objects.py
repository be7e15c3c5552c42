"""resource.k8s.io/v1 JSON as InferGrid's DRA driver and kube-scheduler's DRA plugin write it,
and pods that ask for GPUs by claim: the inputs of the DRA ledger's tests."""

from typing import Any

from infergrid.dra import (
    CLASS_GPU,
    CLASS_MIG,
    CLASS_SHARE,
    DRIVER,
    RESOURCE_GPU_CLAIM,
    gpu_device,
    mig_device,
)

A100_MIB = 81920
A100 = "NVIDIA A100-SXM4-80GB"


def gpu(
    index: int,
    node: str = "dra-a",
    memory_mib: int = A100_MIB,
    shareable: bool = True,
    clique: str = "",
    model: str = A100,
) -> dict[str, Any]:
    """A GPU device of the driver's slice, with consumable memory and cores where shareable."""
    attributes = {
        "type": {"string": "gpu"},
        "uuid": {"string": f"GPU-{node}-{index}"},
        "model": {"string": model},
        "index": {"int": index},
        "smCount": {"int": 108},
        "computeCapability": {"version": "8.0.0"},
        "numaNode": {"int": 0},
    }
    if clique:
        attributes["nvlinkClique"] = {"string": clique}
    capacity: dict[str, Any] = {"memory": {"value": f"{memory_mib}Mi"}}
    device: dict[str, Any] = {"name": gpu_device(index), "attributes": attributes}
    if shareable:
        capacity["memory"]["requestPolicy"] = {"default": f"{memory_mib}Mi"}
        capacity["cores"] = {"value": "100", "requestPolicy": {"default": "0"}}
        device["allowMultipleAllocations"] = True
    device["capacity"] = capacity
    return device


def mig(
    gpu_index: int, n: int, node: str = "dra-a", profile: str = "3g.40gb", memory_mib: int = 40192
) -> dict[str, Any]:
    """A MIG instance device of GPU ``gpu_index``."""
    return {
        "name": mig_device(gpu_index, n),
        "attributes": {
            "type": {"string": "mig"},
            "uuid": {"string": f"MIG-{node}-{gpu_index}-{n}"},
            "migProfile": {"string": profile},
            "parentUUID": {"string": f"GPU-{node}-{gpu_index}"},
            "parentIndex": {"int": gpu_index},
        },
        "capacity": {"memory": {"value": f"{memory_mib}Mi"}},
    }


def resource_slice(
    node: str, devices: list[dict[str, Any]], generation: int = 1, count: int = 1, name: str = ""
) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node}-{DRIVER}-0"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": count},
            "devices": devices,
        },
    }


def whole_request(name: str = "gpu", count: int = 1) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": CLASS_GPU, "count": count}}


def share_request(name: str = "gpu", memory_mib: int = 20480, cores: int | None = None):
    requests = {"memory": f"{memory_mib}Mi"}
    if cores is not None:
        requests["cores"] = str(cores)
    return {
        "name": name,
        "exactly": {"deviceClassName": CLASS_SHARE, "capacity": {"requests": requests}},
    }


def mig_request(name: str = "gpu", profile: str = "3g.40gb") -> dict[str, Any]:
    expression = f'device.attributes["{DRIVER}"].migProfile == "{profile}"'
    return {
        "name": name,
        "exactly": {
            "deviceClassName": CLASS_MIG,
            "selectors": [{"cel": {"expression": expression}}],
        },
    }


def result(
    device: str,
    node: str = "dra-a",
    request: str = "gpu",
    memory_mib: int | None = None,
    cores: int | None = None,
    driver: str = DRIVER,
) -> dict[str, Any]:
    """One allocation result; ``memory_mib``/``cores`` become its consumedCapacity."""
    found: dict[str, Any] = {"request": request, "driver": driver, "pool": node, "device": device}
    consumed = {}
    if memory_mib is not None:
        consumed["memory"] = f"{memory_mib}Mi"
    if cores is not None:
        consumed["cores"] = str(cores)
    if consumed:
        found["consumedCapacity"] = consumed
    return found


def claim(
    name: str,
    requests: list[dict[str, Any]],
    results: list[dict[str, Any]] | None = None,
    reserved: tuple[str, ...] = (),
    namespace: str = "default",
    uid: str = "",
) -> dict[str, Any]:
    """A ResourceClaim; allocated where ``results`` is given, reserved for pod uids."""
    body: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid or f"claim-{name}"},
        "spec": {"devices": {"requests": requests}},
    }
    status: dict[str, Any] = {}
    if results is not None:
        status["allocation"] = {"devices": {"results": results}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": u, "uid": u} for u in reserved]
    if status:
        body["status"] = status
    return body


def claim_pod(
    uid: str,
    claims: dict[str, str],
    priority: int = 0,
    priority_class: str = "",
    namespace: str = "default",
    node: str = "",
) -> dict[str, Any]:
    """A pod asking ``infergrid.io/gpu-claim``, its claims by entry name -> claim name."""
    spec: dict[str, Any] = {
        "containers": [
            {"name": "engine", "resources": {"limits": {RESOURCE_GPU_CLAIM: "1"}}},
        ],
        "resourceClaims": [{"name": e, "resourceClaimName": c} for e, c in claims.items()],
        "priority": priority,
    }
    if priority_class:
        spec["priorityClassName"] = priority_class
    if node:
        spec["nodeName"] = node
    return {
        "metadata": {"uid": uid, "name": uid, "namespace": namespace, "resourceVersion": "1"},
        "spec": spec,
        "status": {"phase": "Pending"},
    }
