"""GPUs by ResourceClaim (DRA): `spec.resources.claims` read, and rendered as templates.

Each entry of `spec.resources.claims` becomes one ResourceClaimTemplate owned by the service;
every engine pod names it under `spec.resourceClaims`, and the resource-claim controller makes
each pod its own claim from it. The engine container lists the claims it uses and asks for
one `infergrid.io/gpu-claim`, the marker that sends the pod through the extender (no node
advertises it, so kube-scheduler ignores it and the kubelet drops it).

A template's spec is immutable (resource/validation ValidateResourceClaimTemplateUpdate), so
its name carries a hash of what it renders: a changed claim is a new template, the Deployment
rolls to it, and the old one goes once no pod can start from it (configmap_gc's rule).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from infergrid import dra
from infergrid.codec import expect, field, integer, join, one_of, reject_unknown, unique
from infergrid.errors import ContractError
from infergrid.quantity import parse_whole_quantity

KINDS: Final = ("gpu", "share", "mig")
CLASSES: Final = {"gpu": dra.CLASS_GPU, "share": dra.CLASS_SHARE, "mig": dra.CLASS_MIG}
MAX_CLAIMS: Final = 8
MAX_COUNT: Final = 8  # as spec.resources.gpus
DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MIG_PROFILE: Final = re.compile(r"^[1-7]g\.[0-9]+gb$")
# A template's name: `<service>-<claim>` cut to fit, then `-` and a hash of what it renders.
TEMPLATE_NAME_LENGTH: Final = 63
TEMPLATE_HASH_LENGTH: Final = 10
API_VERSION: Final = "resource.k8s.io/v1"
KIND: Final = "ResourceClaimTemplate"
_FIELDS: Final = ("name", "kind", "count", "memory", "cores", "migProfile")
_ONLY_FOR: Final = {"count": ("gpu", "mig"), "memory": ("share",), "cores": ("share",),
                    "migProfile": ("mig",)}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Claim:
    """One entry of spec.resources.claims: `count` whole GPUs or MIG instances of
    `mig_profile`, or a share of one GPU with `memory` (a quantity) and `cores` percent."""

    name: str
    kind: str
    count: int = 1
    memory: str | None = None
    cores: int | None = None
    mig_profile: str | None = None


def read_claims(doc: Mapping[str, Any], path: str) -> tuple[Claim, ...]:
    """spec.resources.claims, each entry checked with the field named; () when absent."""
    where = join(path, "claims")
    items = field(doc, "claims", list, path, [])
    if len(items) > MAX_CLAIMS:
        raise ContractError(where, f"at most {MAX_CLAIMS} claims, got {len(items)}")
    claims = tuple(_claim(expect(item, dict, f"{where}[{i}]"), f"{where}[{i}]")
                   for i, item in enumerate(items))  # fmt: skip
    unique(((c.name, f"{where}[{i}].name") for i, c in enumerate(claims)), "claim name")
    return claims


def _claim(doc: dict[str, Any], path: str) -> Claim:
    reject_unknown(doc, _FIELDS, path)
    name = field(doc, "name", str, path)
    if len(name) > 63 or not DNS_LABEL.match(name):
        raise ContractError(join(path, "name"), f"{name!r} is not a DNS label")
    kind = one_of(doc, "kind", KINDS, path, None)
    if kind is None:
        raise ContractError(join(path, "kind"), f"is required: one of {', '.join(KINDS)}")
    for key, kinds in _ONLY_FOR.items():
        if doc.get(key) is not None and kind not in kinds:
            raise ContractError(join(path, key), f"is only allowed for kind {' or '.join(kinds)}")
    if kind == "share":
        cores = None if doc.get("cores") is None else integer(doc, "cores", path, 0, 100)
        return Claim(name, kind, memory=_memory(doc, path), cores=cores)
    count = integer(doc, "count", path, 1, MAX_COUNT, 1)
    if kind == "gpu":
        return Claim(name, kind, count)
    return Claim(name, kind, count, mig_profile=_mig_profile(doc, path))


def _memory(doc: dict[str, Any], path: str) -> str:
    """A quantity of bytes above zero, kept as written: the API server canonicalises it."""
    raw = doc.get("memory")
    if raw is None:
        raise ContractError(join(path, "memory"), "is required for kind share, e.g. 4Gi")
    memory = str(raw) if isinstance(raw, int) and not isinstance(raw, bool) else raw
    if parse_whole_quantity(memory, join(path, "memory")) == 0:
        raise ContractError(join(path, "memory"), "must be above zero")
    return memory


def _mig_profile(doc: dict[str, Any], path: str) -> str:
    if doc.get("migProfile") is None:
        raise ContractError(join(path, "migProfile"), "is required for kind mig, e.g. 3g.40gb")
    profile = field(doc, "migProfile", str, path)
    if not MIG_PROFILE.match(profile):
        raise ContractError(
            join(path, "migProfile"), f"{profile!r} is not a MIG profile like 3g.40gb"
        )
    return profile


def whole_gpus(claims: Iterable[Claim]) -> int:
    """The whole GPUs a replica's claims hold: the engine's tensor-parallel ranks."""
    return sum(c.count for c in claims if c.kind == "gpu")


def device_request(claim: Claim) -> dict[str, Any]:
    """The claim's one request: ExactCount devices of its kind's DeviceClass, with the share's
    capacity or the MIG profile's selector."""
    exactly: dict[str, Any] = {
        "deviceClassName": CLASSES[claim.kind],
        "allocationMode": "ExactCount",
        "count": claim.count,
    }
    if claim.memory is not None:
        requests: dict[str, Any] = {dra.CAP_MEMORY: claim.memory}
        if claim.cores is not None:
            requests[dra.CAP_CORES] = str(claim.cores)
        exactly["capacity"] = {"requests": requests}
    if claim.mig_profile is not None:
        expression = (
            f'device.attributes["{dra.DRIVER}"].{dra.ATTR_MIG_PROFILE} == "{claim.mig_profile}"'
        )
        exactly["selectors"] = [{"cel": {"expression": expression}}]
    return {"name": claim.name, "exactly": exactly}


def template_name(service: str, claim: Claim) -> str:
    """`<service>-<claim>-<hash>`, at most 63 characters. The hash covers the service's and
    the claim's names and what the template renders, so two services never share a name
    (`a-b` + `c` and `a` + `b-c`) and a changed claim gets a new one."""
    text = json.dumps([service, claim.name, device_request(claim)], sort_keys=True)
    digest = hashlib.sha256(text.encode()).hexdigest()[:TEMPLATE_HASH_LENGTH]
    prefix = f"{service}-{claim.name}"[: TEMPLATE_NAME_LENGTH - TEMPLATE_HASH_LENGTH - 1]
    return f"{prefix.rstrip('-')}-{digest}"


def render_template(
    service: str, namespace: str, claim: Claim, labels: Mapping[str, str]
) -> dict[str, Any]:
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": template_name(service, claim), "namespace": namespace,
                     "labels": dict(labels)},
        "spec": {"spec": {"devices": {"requests": [device_request(claim)]}}},
    }  # fmt: skip


def pod_claims(service: str, claims: Iterable[Claim]) -> list[dict[str, str]]:
    """The pod spec's resourceClaims: one per entry, made from its template."""
    return [{"name": c.name, "resourceClaimTemplateName": template_name(service, c)}
            for c in claims]  # fmt: skip


def container_claims(claims: Iterable[Claim]) -> dict[str, Any]:
    """The engine container's resources beyond CPU and memory: the claims it uses, and the
    marker that routes the pod through the extender."""
    marker = {dra.RESOURCE_GPU_CLAIM: "1"}
    return {"claims": [{"name": c.name} for c in claims], "requests": dict(marker),
            "limits": dict(marker)}  # fmt: skip


def templates_named(pod_spec: Mapping[str, Any]) -> set[str]:
    """The ResourceClaimTemplates a pod spec makes its claims from."""
    named = pod_spec.get("resourceClaims") or []
    return {c["resourceClaimTemplateName"] for c in named if c.get("resourceClaimTemplateName")}
