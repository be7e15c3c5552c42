"""Which GPU models a pod accepts, and how a GPU's model is named.

An InferenceService's `spec.resources.gpuModels` and `minComputeCapability`
reach the pod in two forms from here: node affinity on the labels the device
plugin puts on every node (`node_affinity`), which lets kube-scheduler drop
whole nodes early, and the annotations `infergrid.io/gpu-models` and
`infergrid.io/min-compute-capability` (`constraint_annotations`), which the
extender reads to check each GPU (`GpuConstraint.why_not`), since a node's
labels can only describe one model. A node with several models is labelled
`infergrid.io/gpu.mixed=true` and passes the affinity, so the extender decides.

A model is named either as NVML reports it ("NVIDIA A100-SXM4-80GB") or by
its short name ("a100-80gb"): the family in lower case and the memory size.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from infergrid.constants import (
    ANNOTATION_GPU_MODELS,
    ANNOTATION_MIN_COMPUTE_CAPABILITY,
    LABEL_GPU_COMPUTE_LEVEL,
    LABEL_GPU_MIXED,
    LABEL_GPU_MODEL,
    LABEL_GPU_PRODUCT,
)
from infergrid.errors import ContractError

# Marketed memory sizes in GB; a GPU reports a little less than its size (driver reserve).
_SIZES_GB: Final = (4, 6, 8, 10, 11, 12, 16, 20, 24, 32, 40, 48, 64, 80, 94, 96, 128, 141,
                    144, 180, 192, 288)  # fmt: skip
_BRANDS: Final = frozenset({"nvidia", "tesla", "geforce", "quadro"})
_SIZE_IN_NAME: Final = re.compile(r"(?<![0-9])([0-9]+)GB", re.IGNORECASE)
_CAPABILITY: Final = re.compile(r"([0-9]{1,2})\.([0-9])")  # what a user may ask for
_REPORTED: Final = re.compile(r"([0-9]+)\.([0-9]+)")  # what an inventory may carry
_LABEL_FORBIDDEN: Final = re.compile(r"[^A-Za-z0-9_.-]")
_LABEL_MAX: Final = 63
MAX_MODELS: Final = 16
MAX_MODEL_NAME: Final = 128


def short_name(model: str, memory_mib: int) -> str:
    """The model's short name: "NVIDIA H100 80GB HBM3" -> "h100-80gb", "Tesla T4" -> "t4-16gb".

    The family is the first word after the brand ("RTX 4090" joins into "rtx4090"); the
    size is the one the name carries, or else the smallest marketed size at least the
    reported memory, so 15360 MiB on a T4 reads as 16 GB.
    """
    words = [w for w in re.split(r"[\s\-_/]+", model) if w and w.lower() not in _BRANDS]
    family = ""
    for word in words:
        if _SIZE_IN_NAME.fullmatch(word):
            break
        family += word.lower()
        if any(c.isdigit() for c in word):
            break
    sized = _SIZE_IN_NAME.search(model)
    gb = int(sized.group(1)) if sized else _marketed_gb(memory_mib)
    return f"{label_value(family) or 'gpu'}-{gb}gb"


def _marketed_gb(memory_mib: int) -> int:
    reported = memory_mib / 1024
    return next((s for s in _SIZES_GB if s >= reported), -(-memory_mib // 1024))


def label_value(text: str) -> str:
    """``text`` made a valid label value: other characters become '-', at most 63 long."""
    return _LABEL_FORBIDDEN.sub("-", text)[:_LABEL_MAX].strip("-_.")


def parse_capability(text: str, where: str) -> tuple[int, int]:
    """A compute capability like "8.0" as (8, 0)."""
    match = _CAPABILITY.fullmatch(text.strip())
    if not match:
        raise ContractError(where, f"{text!r} is not a compute capability like 8.0")
    return int(match.group(1)), int(match.group(2))


def reported_capability(capability: str) -> tuple[int, int]:
    """A GPU's reported compute capability as (major, minor); (0, 0) when unreadable."""
    match = _REPORTED.fullmatch(capability)
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def compute_level(capability: str) -> int:
    """A GPU's reported capability as the integer its node is labelled with."""
    return _level(reported_capability(capability))


def _level(capability: tuple[int, int]) -> int:
    """major*10+minor: the integer node affinity compares (every minor so far is 0-9)."""
    major, minor = capability
    return major * 10 + minor


def _shown(capability: tuple[int, int]) -> str:
    """A capability as users write it, "8.0"."""
    return "{}.{}".format(*capability)


def model_names(model: str, memory_mib: int) -> frozenset[str]:
    """Every name a pod may use for this model: NVML's, its label form, its short name."""
    return frozenset({model, label_value(model), short_name(model, memory_mib)})


@dataclass(frozen=True, slots=True)
class GpuConstraint:
    """The GPU models a pod accepts (any, when empty) and the least compute capability."""

    models: tuple[str, ...] = ()
    min_capability: tuple[int, int] | None = None

    @property
    def empty(self) -> bool:
        return not self.models and self.min_capability is None

    def why_not(self, model: str, memory_mib: int, capability: str) -> str | None:
        """None when a GPU of this model suits the pod; else a reason naming both sides."""
        found = f"{model} ({short_name(model, memory_mib)})"
        if self.models and not model_names(model, memory_mib) & set(self.models):
            return f"GPU model {', '.join(self.models)} asked for, found {found}"
        if self.min_capability is not None:
            if reported_capability(capability) < self.min_capability:
                wanted = _shown(self.min_capability)
                return (
                    f"compute capability {wanted} or more asked for, found {capability} on {found}"
                )
        return None


def check_models(models: Iterable[object], where: str) -> tuple[str, ...]:
    """A list of model names, each a non-empty string of at most MAX_MODEL_NAME characters."""
    names = list(models)
    if not 1 <= len(names) <= MAX_MODELS:
        raise ContractError(where, f"name 1 to {MAX_MODELS} GPU models, got {len(names)}")
    out = []
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name.strip() or len(name) > MAX_MODEL_NAME:
            raise ContractError(
                f"{where}[{i}]", f"must be a GPU model name of 1 to {MAX_MODEL_NAME} characters"
            )
        if "," in name:
            raise ContractError(f"{where}[{i}]", f"{name!r}: a model name has no comma")
        if not label_value(name.strip()):
            raise ContractError(
                f"{where}[{i}]", f"{name!r}: no letter or digit, so no node label can match it"
            )
        out.append(name.strip())
    return tuple(out)


def constraint_annotations(constraint: GpuConstraint) -> dict[str, str]:
    """The pod annotations the extender reads the constraint from; none when it is empty."""
    annotations = {}
    if constraint.models:
        annotations[ANNOTATION_GPU_MODELS] = ",".join(constraint.models)
    if constraint.min_capability is not None:
        annotations[ANNOTATION_MIN_COMPUTE_CAPABILITY] = _shown(constraint.min_capability)
    return annotations


def read_constraint(annotations: Mapping[str, Any]) -> GpuConstraint:
    """The constraint a pod's annotations carry, each refused naming the annotation."""
    models: tuple[str, ...] = ()
    capability = None
    raw = annotations.get(ANNOTATION_GPU_MODELS)
    where = f"metadata.annotations[{ANNOTATION_GPU_MODELS}]"
    if raw is not None:
        if not isinstance(raw, str):
            raise ContractError(where, "must be a comma-separated list of GPU models")
        models = check_models(raw.split(","), where)
    raw = annotations.get(ANNOTATION_MIN_COMPUTE_CAPABILITY)
    if raw is not None:
        where = f"metadata.annotations[{ANNOTATION_MIN_COMPUTE_CAPABILITY}]"
        if not isinstance(raw, str):
            raise ContractError(where, f"must be a string like 8.0, not {type(raw).__name__}")
        capability = parse_capability(raw, where)
    return GpuConstraint(models, capability)


def node_affinity(constraint: GpuConstraint) -> dict[str, Any] | None:
    """Required node affinity that keeps only nodes which may hold a suitable GPU.

    A node passes when its labelled product or short model is asked for, or when it
    has several models (the extender then checks each GPU); and, with a least compute
    capability, when its highest one reaches it.
    """
    if constraint.empty:
        return None
    level = []
    if constraint.min_capability is not None:
        bound = str(_level(constraint.min_capability) - 1)
        level = [{"key": LABEL_GPU_COMPUTE_LEVEL, "operator": "Gt", "values": [bound]}]
    if not constraint.models:
        terms = [{"matchExpressions": level}]
    else:
        values = sorted({label_value(m) for m in constraint.models} - {""})
        keyed = (
            (LABEL_GPU_PRODUCT, values),
            (LABEL_GPU_MODEL, values),
            (LABEL_GPU_MIXED, ["true"]),
        )
        terms = [
            {"matchExpressions": [{"key": key, "operator": "In", "values": v}, *level]}
            for key, v in keyed
        ]
    return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
