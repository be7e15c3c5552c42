"""Measured GPU use of a node, as the device plugin refreshes it in ``infergrid.io/gpu-usage``.

A GPU's free memory is its total less the larger of what is assigned and what is
measured, so memory used outside InferGrid still counts; the heartbeat lets the
extender stop offering a node whose plugin has gone quiet.
"""

from dataclasses import dataclass
from datetime import datetime

from infergrid.codec import (
    decode_time,
    dump_document,
    each,
    encode_time,
    field,
    integer,
    join,
    load_document,
    unique,
)
from infergrid.constants import ANNOTATION_GPU_USAGE


@dataclass(frozen=True, slots=True)
class GpuUsageSample:
    """What one GPU uses right now."""

    uuid: str
    used_mib: int
    utilization_percent: int


@dataclass(frozen=True, slots=True)
class GpuUsage:
    """Samples of every GPU of a node, taken at ``heartbeat`` (timezone-aware UTC)."""

    node: str
    heartbeat: datetime
    gpus: tuple[GpuUsageSample, ...]


def encode_usage(usage: GpuUsage) -> str:
    """The annotation value for ``usage``."""
    return dump_document(
        {
            "node": usage.node,
            "heartbeat": encode_time(usage.heartbeat, "heartbeat"),
            "gpus": [
                {"uuid": s.uuid, "usedMiB": s.used_mib, "utilizationPercent": s.utilization_percent}
                for s in usage.gpus
            ],
        }
    )


def decode_usage(text: str) -> GpuUsage:
    """The usage in an annotation value; ContractError names the first bad field."""
    doc = load_document(text, ANNOTATION_GPU_USAGE)
    samples = [
        (
            GpuUsageSample(
                uuid=field(obj, "uuid", str, path),
                used_mib=integer(obj, "usedMiB", path),
                utilization_percent=integer(obj, "utilizationPercent", path, 0, 100),
            ),
            path,
        )
        for obj, path in each(doc, "gpus", dict)
    ]
    unique(((s.uuid, join(p, "uuid")) for s, p in samples), "GPU uuid")
    return GpuUsage(
        node=field(doc, "node", str),
        heartbeat=decode_time(doc, "heartbeat"),
        gpus=tuple(s for s, _ in samples),
    )
