"""What a pod asks of a node besides GPUs: CPU, memory, and which GPU models it accepts.

In a cluster kube-scheduler checks these before the extender is asked
(NodeResourcesFit for CPU and memory, node affinity on the
``infergrid.io/gpu.product`` label for the model), so the extender passes no
``HostRequest``. The trace simulator has no kube-scheduler: it passes one, and
``fit`` checks and reserves it with the GPUs, on nodes that carry ``host``.
"""

from dataclasses import dataclass, replace

from infergrid.constants import LABEL_GPU_PRODUCT
from infergrid.errors import ContractError
from infergrid.placement.shortfall import Shortfall
from infergrid.placement.state import NodeState

RESOURCE_CPU = "cpu"
RESOURCE_MEMORY = "memory"


@dataclass(frozen=True, slots=True)
class HostRequest:
    """CPU millicores and memory MiB the pod requests, and the GPU models it may run on.

    ``gpu_models`` empty means any model; it only restricts pods that ask for GPUs.
    """

    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ContractError("host request", f"amounts must not be negative: {self}")


def model_allowed(node: NodeState, request: HostRequest) -> bool:
    """Whether the node's labelled GPU model is one the request accepts."""
    return not request.gpu_models or node.product in request.gpu_models


def host_shortfalls(
    node: NodeState, request: HostRequest | None, wants_gpus: bool
) -> tuple[Shortfall, ...]:
    """Every reason the node cannot host the pod apart from its GPUs; () when it can.

    Nothing is checked without a request; CPU and memory only on nodes that track them.
    """
    if request is None:
        return ()
    found: list[Shortfall] = []
    if wants_gpus and not model_allowed(node, request):
        allowed = ", ".join(sorted(request.gpu_models))
        reason = f"GPU model {node.product or 'none'!r} is not one of {allowed}"
        found.append(Shortfall(None, LABEL_GPU_PRODUCT, 0, 0, reason))
    host = node.host
    if host is None:
        return tuple(found)
    if host.free_cpu_milli < request.cpu_milli:
        free, needed = host.free_cpu_milli, request.cpu_milli
        reason = f"{free} millicores of CPU free, needs {needed}"
        found.append(Shortfall(None, RESOURCE_CPU, free, needed, reason))
    if host.free_memory_mib < request.memory_mib:
        free, needed = host.free_memory_mib, request.memory_mib
        reason = f"{free} MiB of memory free, needs {needed}"
        found.append(Shortfall(None, RESOURCE_MEMORY, free, needed, reason))
    return tuple(found)


def reserve_host(node: NodeState, request: HostRequest | None) -> NodeState:
    """``node`` with the request's CPU and memory reserved; unchanged without either."""
    host = node.host
    if request is None or host is None or not (request.cpu_milli or request.memory_mib):
        return node
    changed = replace(
        host,
        requested_cpu_milli=host.requested_cpu_milli + request.cpu_milli,
        requested_memory_mib=host.requested_memory_mib + request.memory_mib,
    )
    return replace(node, host=changed)
