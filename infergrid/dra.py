"""What InferGrid's DRA driver publishes and what its readers agree on: the driver's name, its
DeviceClasses, how a GPU, a MIG instance and a share look in a ResourceSlice and a claim.

The DRA driver (``dra_driver/``) writes ResourceSlices and prepares claims by these names; the
extender reads the same slices and allocated claims to keep one ledger across device-plugin
and DRA nodes; the chart's DeviceClasses and the operator's claim templates select by them.

One device per GPU, ``gpu-<index>``. Where the cluster has ``DRAConsumableCapacity`` on, it
allows multiple allocations and offers its ``memory`` and ``cores`` as consumable capacity: a
claim that asks for no capacity gets the defaults, all the memory, so it holds the GPU whole;
a share asks for its memory (and optionally cores). One device per MIG instance,
``mig-<gpu index>-<instance index>``; with ``DRAPartitionableDevices`` on, the instances of a
GPU draw its MIG slices and memory from a shared counter set ``gpu-<index>-counters``.
"""

from __future__ import annotations

from typing import Final

DRIVER: Final = "gpu.infergrid.io"
"""The DRA driver's name: its kubelet plugin, the ``driver`` of its slices and claim results,
and the domain of its attributes and capacities."""

CLASS_GPU: Final = "gpu.infergrid.io"
"""DeviceClass of whole GPUs (and, with consumable capacity, the GPUs shares are carved from)."""
CLASS_SHARE: Final = "gpu-share.infergrid.io"
"""DeviceClass of memory/SM shares of a GPU: a claim of it asks for ``memory`` capacity."""
CLASS_MIG: Final = "mig.gpu.infergrid.io"
"""DeviceClass of MIG instances; a claim picks a profile by the ``migProfile`` attribute."""

TYPE_GPU: Final = "gpu"
TYPE_MIG: Final = "mig"

# Attribute names, in the driver's domain (a selector reads device.attributes["gpu.infergrid.io"]).
ATTR_TYPE: Final = "type"  # string: "gpu" or "mig"
ATTR_UUID: Final = "uuid"  # string: the GPU's or MIG instance's UUID
ATTR_MODEL: Final = "model"  # string: NVML's product name
ATTR_INDEX: Final = "index"  # int: the GPU's NVML index
ATTR_SM_COUNT: Final = "smCount"  # int
ATTR_COMPUTE_CAPABILITY: Final = "computeCapability"  # version: "8.0" as "8.0.0"
ATTR_NUMA_NODE: Final = "numaNode"  # int, -1 where the node has none
ATTR_NVLINK_CLIQUE: Final = "nvlinkClique"  # string: GPUs joined by NVLink share one
ATTR_MIG_PROFILE: Final = "migProfile"  # string, MIG devices only: "3g.40gb"
ATTR_PARENT_UUID: Final = "parentUUID"  # string, MIG devices only
ATTR_PARENT_INDEX: Final = "parentIndex"  # int, MIG devices only

# Capacity names, in the driver's domain.
CAP_MEMORY: Final = "memory"  # a quantity in bytes ("81920Mi")
CAP_CORES: Final = "cores"  # the share of the GPU's SMs, percent (consumable, default 0)
CAP_MIG_SLICES: Final = "migSlices"  # counter: compute slices of the 7 a MIG GPU has

# Counter names in a MIG GPU's shared counter set: the API wants DNS labels (lower case), so
# the counter of CAP_MIG_SLICES is spelled with a dash.
COUNTER_MIG_SLICES: Final = "mig-slices"
COUNTER_MEMORY: Final = "memory"

FEATURE_GATES: Final = {"DRAConsumableCapacity": True, "DRAPartitionableDevices": True}
"""The alpha gates DRA mode uses beyond DRA itself (GA, and locked on from 1.35): consumable
capacity (1.34) for shares, partitionable devices (1.33) for MIG with shared counters. The API
server, kube-scheduler, the controller manager and the kubelet each need them; without them the
driver publishes whole GPUs and static MIG devices only."""


def feature_gates_flag() -> str:
    """``--feature-gates=...`` for a Kubernetes component, the gates in a stable order."""
    gates = ",".join(f"{name}={str(on).lower()}" for name, on in sorted(FEATURE_GATES.items()))
    return f"--feature-gates={gates}"


RESOURCE_GPU_CLAIM: Final = "infergrid.io/gpu-claim"
"""The extended resource a pod whose GPUs come by ResourceClaim asks for (1), so kube-scheduler
sends it to the extender (its managedResources, ignored by the scheduler's own fit). No node
advertises it; the kubelet drops a requested extended resource its node lacks."""

CDI_VENDOR_CLASS: Final = "infergrid.io/gpu"
"""The CDI kind of the devices the driver's specs name: ``infergrid.io/gpu=<claim uid>-<n>``."""


def gpu_device(index: int) -> str:
    return f"gpu-{index}"


def mig_device(gpu_index: int, instance: int) -> str:
    return f"mig-{gpu_index}-{instance}"


def counter_set(gpu_index: int) -> str:
    return f"gpu-{gpu_index}-counters"
