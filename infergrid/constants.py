"""Names shared by every part: resources, annotations, labels, the CRD, enums.

They are the default names; the chart may rename resources, never the schemas.
"""

from typing import Final

# Resources a container asks for.
RESOURCE_GPU: Final = "nvidia.com/gpu"
RESOURCE_VGPU: Final = "infergrid.io/vgpu"
RESOURCE_GPU_MEMORY: Final = "infergrid.io/gpu-memory"
RESOURCE_GPU_CORES: Final = "infergrid.io/gpu-cores"
RESOURCE_MIG_PREFIX: Final = "nvidia.com/mig-"
RESOURCE_DOMAIN_PREFIX: Final = "infergrid.io/"


def mig_resource(profile: str) -> str:
    """The extended resource of one MIG profile, e.g. nvidia.com/mig-1g.10gb."""
    return RESOURCE_MIG_PREFIX + profile


# Annotations: node ones are written by the device plugin, pod inputs by users,
# and the assignment by the extender.
ANNOTATION_GPU_INVENTORY: Final = "infergrid.io/gpu-inventory"
ANNOTATION_GPU_USAGE: Final = "infergrid.io/gpu-usage"
ANNOTATION_GPU_ASSIGNMENT: Final = "infergrid.io/gpu-assignment"
ANNOTATION_PLACEMENT_POLICY: Final = "infergrid.io/placement-policy"
ANNOTATION_TOPOLOGY: Final = "infergrid.io/topology"
ANNOTATION_GPU_MODELS: Final = "infergrid.io/gpu-models"
ANNOTATION_MIN_COMPUTE_CAPABILITY: Final = "infergrid.io/min-compute-capability"

# A pod condition the device plugin sets: "False" while a GPU the pod holds is unhealthy,
# "True" once it is healthy again. The operator moves pods that keep it "False".
CONDITION_GPU_HEALTHY: Final = "infergrid.io/GPUHealthy"

# Node labels, for nodeSelector and affinity.
LABEL_GPU_PRODUCT: Final = "infergrid.io/gpu.product"
LABEL_GPU_COUNT: Final = "infergrid.io/gpu.count"
LABEL_GPU_MEMORY: Final = "infergrid.io/gpu.memory"
LABEL_MIG_CAPABLE: Final = "infergrid.io/mig.capable"
LABEL_GPU_MODEL: Final = "infergrid.io/gpu.model"  # short name, e.g. a100-80gb
LABEL_GPU_COMPUTE_CAPABILITY: Final = "infergrid.io/gpu.compute-capability"  # e.g. 8.9
# The node's highest compute capability as major*10+minor (89): affinity's Gt needs an integer.
LABEL_GPU_COMPUTE_LEVEL: Final = "infergrid.io/gpu.compute-level"
LABEL_GPU_MIXED: Final = "infergrid.io/gpu.mixed"  # "true" on a node with several GPU models

SCHEDULER_NAME: Final = "infergrid-scheduler"

# The InferenceService custom resource.
CRD_GROUP: Final = "infergrid.io"
CRD_VERSION: Final = "v1alpha1"
CRD_KIND: Final = "InferenceService"
CRD_PLURAL: Final = "inferenceservices"
CRD_SHORT_NAME: Final = "infsvc"

# Placement policies a pod may ask for.
POLICY_BINPACK: Final = "binpack"
POLICY_SPREAD: Final = "spread"
POLICY_FGD: Final = "fgd"
# fgd, plus what it ignores of the cluster: CPU per GPU and how contested each GPU model is.
POLICY_FGD_CLUSTER_AWARE: Final = "fgd-cluster-aware"
PLACEMENT_POLICIES: Final = (POLICY_BINPACK, POLICY_SPREAD, POLICY_FGD, POLICY_FGD_CLUSTER_AWARE)
DEFAULT_POLICY: Final = POLICY_FGD_CLUSTER_AWARE

# Policies only the trace simulator runs, to compare with the ones above: the
# baselines of the FGD paper (USENIX ATC '23). Pods cannot ask for them.
POLICY_BEST_FIT: Final = "best-fit"
POLICY_DOT_PRODUCT: Final = "dot-product"
POLICY_GPU_PACKING: Final = "gpu-packing"
POLICY_GPU_CLUSTERING: Final = "gpu-clustering"
POLICY_RANDOM_FIT: Final = "random-fit"
POLICY_FGD_PAPER: Final = "fgd-paper"
BASELINE_POLICIES: Final = (
    POLICY_FGD_PAPER,
    POLICY_BEST_FIT,
    POLICY_DOT_PRODUCT,
    POLICY_GPU_PACKING,
    POLICY_GPU_CLUSTERING,
    POLICY_RANDOM_FIT,
)

# Topology a pod may require of its GPU set.
TOPOLOGY_NVLINK: Final = "nvlink"
TOPOLOGIES: Final = (TOPOLOGY_NVLINK,)

# How two GPUs are connected, closest first.
LINK_NVLINK: Final = "nvlink"
LINK_PCIE_SWITCH: Final = "pcie-switch"
LINK_HOST_BRIDGE: Final = "host-bridge"
LINK_NUMA: Final = "numa"
LINK_SYSTEM: Final = "system"
LINK_TYPES: Final = (LINK_NVLINK, LINK_PCIE_SWITCH, LINK_HOST_BRIDGE, LINK_NUMA, LINK_SYSTEM)

# Engine metrics the operator's autoscaler reads from each engine pod's /metrics.
METRIC_ENGINE_QUEUE_DEPTH: Final = "infergrid_engine_queue_depth"  # gauge
METRIC_ENGINE_RUNNING: Final = "infergrid_engine_running_sequences"  # gauge
METRIC_ENGINE_E2E_LATENCY: Final = "infergrid_engine_e2e_latency_seconds"  # histogram
METRIC_ENGINE_GPU_UTILIZATION: Final = "infergrid_engine_gpu_utilization_percent"  # gauge
METRIC_ENGINE_KV_USAGE: Final = "infergrid_engine_kv_cache_usage_ratio"  # gauge, 0..1
# On every child of an InferenceService (its Service, hence its EndpointSlices, and pods):
# the service's name. The operator sets it; the gateway watches the slices that carry it.
LABEL_INFERENCESERVICE: Final = "infergrid.io/inferenceservice"
# Requests the gateway holds for a service with no ready pod (labels namespace, service): the
# operator's autoscaler counts them as demand, so a service at zero replicas scales up.
METRIC_GATEWAY_PENDING: Final = "infergrid_gateway_pending_requests"  # gauge

# Version of every JSON document and fleet file in the contract.
SCHEMA_VERSION: Final = "v1"

# A vGPU slot is one share a GPU can be split into, as advertised to the kubelet.
DEFAULT_VGPU_SLOTS_PER_GPU: Final = 10
MAX_VGPU_SLOTS_PER_GPU: Final = 128

# Time slices: pods asking nvidia.com/gpu that may hold one GPU at once, each seeing all of it.
MAX_TIME_SLICES_PER_GPU: Final = 64

SYSTEM_CLASS_PREFIX: Final = "system-"
"""PriorityClasses of the cluster's own parts (system-node-critical, ...): no InferenceService
may name one, and preemption never evicts a pod of one."""
