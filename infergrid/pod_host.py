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

from typing import Any, Final

from infergrid.constants import LABEL_GPU_PRODUCT
from infergrid.errors import ContractError
from infergrid.placement.host import HostRequest
from infergrid.quantity import parse_milli_quantity, parse_whole_quantity

MIB: Final = 1 << 20


def mib_rounded_up(amount: int) -> int:
    """Bytes in MiB, rounded up (exact: no float for amounts up to 2^63)."""
    return -(-amount // MIB)


def parse_host_request(pod: dict[str, Any]) -> HostRequest:
    """The pod's effective CPU (millicores) and memory (MiB, rounded up) requests and the
    GPU models it may run on (empty: any). A bad amount raises a ContractError naming it."""
    spec = _object(pod.get("spec"), "spec")
    cpu = _effective(spec, "cpu", parse_milli_quantity)
    memory = _effective(spec, "memory", parse_whole_quantity)
    return HostRequest(cpu, mib_rounded_up(memory), gpu_models(spec))


def gpu_models(spec: dict[str, Any]) -> frozenset[str]:
    """The GPU models (``infergrid.io/gpu.product`` values) the pod's nodeSelector and
    required node affinity allow; empty when they allow any."""
    allowed: frozenset[str] | None = None
    selected = _object(spec.get("nodeSelector"), "spec.nodeSelector").get(LABEL_GPU_PRODUCT)
    if isinstance(selected, str):
        allowed = frozenset({selected})
    required, path = spec, "spec"
    for key in ("affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution"):
        path = f"{path}.{key}"
        required = _object(required.get(key), path)
    path = f"{path}.nodeSelectorTerms"
    by_terms = _term_models(_array(required.get("nodeSelectorTerms"), path), path)
    if by_terms is not None:
        allowed = by_terms if allowed is None else allowed & by_terms
    return allowed or frozenset()


def _term_models(terms: list[Any], path: str) -> frozenset[str] | None:
    """Models the ORed node selector terms allow; None when some term allows any."""
    union: set[str] = set()
    for at, term in enumerate(terms):
        values = None
        where = f"{path}[{at}].matchExpressions"
        expressions = _array(_object(term, f"{path}[{at}]").get("matchExpressions"), where)
        for i, listed_expression in enumerate(expressions):
            expression = _object(listed_expression, f"{where}[{i}]")
            if expression.get("key") == LABEL_GPU_PRODUCT and expression.get("operator") == "In":
                listed = _array(expression.get("values"), f"{where}[{i}].values")
                found = frozenset(v for v in listed if isinstance(v, str))
                values = found if values is None else values & found
        if values is None:
            return None
        union |= values
    return frozenset(union) if terms else None


def _effective(spec: dict[str, Any], resource: str, parse: Any) -> int:
    def asked(container: Any, path: str) -> int:
        resources = _object(_object(container, path).get("resources"), f"{path}.resources")
        requests = _object(resources.get("requests"), f"{path}.resources.requests")
        raw = requests.get(resource)
        return 0 if raw is None else int(parse(raw, f"{path}.resources.requests.{resource}"))

    running = 0
    init_peak = 0
    for at, init in enumerate(_array(spec.get("initContainers"), "spec.initContainers")):
        amount = asked(init, f"spec.initContainers[{at}]")
        if init.get("restartPolicy") == "Always":
            running += amount  # a sidecar runs beside everything after it
        else:
            init_peak = max(init_peak, running + amount)
    for at, container in enumerate(_array(spec.get("containers"), "spec.containers")):
        running += asked(container, f"spec.containers[{at}]")
    overhead = _object(spec.get("overhead"), "spec.overhead").get(resource)
    extra = 0 if overhead is None else int(parse(overhead, f"spec.overhead.{resource}"))
    return max(running, init_peak) + extra


def _object(value: Any, path: str) -> dict[str, Any]:
    """An object of the pod's JSON, absent (null) read as empty; any other kind is refused:
    hand-made pods reach the extender, and `.get` on a list raised past its readers."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ContractError(path, f"must be an object, not {type(value).__name__}")
    return value


def _array(value: Any, path: str) -> list[Any]:
    """A list of the pod's JSON, absent (null) read as empty; any other kind is refused."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ContractError(path, f"must be a list, not {type(value).__name__}")
    return value
