"""What a pod asks of a node besides GPUs, read from its Kubernetes JSON: the CPU and
memory requests kube-scheduler counts, and the GPU models its node selection allows.

kube-scheduler checks these itself; the extender reads them to learn the typical
pods that fgd and fgd-cluster-aware score against (``LearnedWorkload``), to count
what each node's pods request, and to score a pod with its CPU, as the trace
simulator's pods carry them. The amounts follow Kubernetes' rule for
a pod's effective request: the larger of what its containers (and sidecars) need
together and what any init container needs while the sidecars declared before it
run, plus the pod's overhead.
"""

from collections.abc import Iterable
from typing import Any, Final

from infergrid.constants import LABEL_GPU_PRODUCT
from infergrid.placement.host import HostRequest
from infergrid.quantity import parse_milli_quantity, parse_whole_quantity

MIB: Final = 1 << 20


def mib_rounded_up(amount: int) -> int:
    """Bytes in MiB, rounded up (exact: no float for amounts up to 2^63)."""
    return -(-amount // MIB)


def parse_host_request(pod: dict[str, Any]) -> HostRequest:
    """The pod's effective CPU (millicores) and memory (MiB, rounded up) requests and the
    GPU models it may run on (empty: any). A bad amount raises a ContractError naming it."""
    spec = pod.get("spec") or {}
    cpu = _effective(spec, "cpu", parse_milli_quantity)
    memory = _effective(spec, "memory", parse_whole_quantity)
    return HostRequest(cpu, mib_rounded_up(memory), gpu_models(spec))


def gpu_models(spec: dict[str, Any]) -> frozenset[str]:
    """The GPU models (``infergrid.io/gpu.product`` values) the pod's nodeSelector and
    required node affinity allow; empty when they allow any."""
    allowed: frozenset[str] | None = None
    selected = (spec.get("nodeSelector") or {}).get(LABEL_GPU_PRODUCT)
    if isinstance(selected, str):
        allowed = frozenset({selected})
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    by_terms = _term_models(terms)
    if by_terms is not None:
        allowed = by_terms if allowed is None else allowed & by_terms
    return allowed or frozenset()


def _term_models(terms: Iterable[Any]) -> frozenset[str] | None:
    """Models the ORed node selector terms allow; None when some term allows any."""
    union: set[str] = set()
    for term in terms:
        values = None
        for expression in (term or {}).get("matchExpressions") or []:
            if expression.get("key") == LABEL_GPU_PRODUCT and expression.get("operator") == "In":
                found = frozenset(v for v in expression.get("values") or [] if isinstance(v, str))
                values = found if values is None else values & found
        if values is None:
            return None
        union |= values
    return frozenset(union) if terms else None


def _effective(spec: dict[str, Any], resource: str, parse: Any) -> int:
    def asked(container: dict[str, Any], path: str) -> int:
        raw = ((container.get("resources") or {}).get("requests") or {}).get(resource)
        return 0 if raw is None else int(parse(raw, f"{path}.resources.requests.{resource}"))

    running = 0
    init_peak = 0
    for at, init in enumerate(spec.get("initContainers") or []):
        amount = asked(init, f"spec.initContainers[{at}]")
        if init.get("restartPolicy") == "Always":
            running += amount  # a sidecar runs beside everything after it
        else:
            init_peak = max(init_peak, running + amount)
    for at, container in enumerate(spec.get("containers") or []):
        running += asked(container, f"spec.containers[{at}]")
    overhead = (spec.get("overhead") or {}).get(resource)
    extra = 0 if overhead is None else int(parse(overhead, f"spec.overhead.{resource}"))
    return max(running, init_peak) + extra
