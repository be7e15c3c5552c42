"""The extender as a real process, fuzzed from its own OpenAPI document.

The process (this module run as a script) serves the extender's two listeners as main.py
wires them (tentative reservations, the preemptor, the bind barrier), on a cache listed from
the sample fleet plus one node whose inventory cannot be read and one running pod that holds
GPUs. Only the API server across the seam is a stand-in: every pod read is a 404 and every
eviction is refused, so a bind ends in a refusal that says why. The property is the one
kube-scheduler relies on: never a 5xx, never a hung call, every 400's `Error` names a field,
and no 200 whose `Error` is an exception the extender caught ("internal error: ...").

    python -m tests.fuzzing.test_extender   # serves, and prints {"verbs": port, "metrics": port}
"""

from __future__ import annotations

import asyncio
import copy
import json
import select
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from infergrid.openapi import operations
from scheduler_extender import protocol
from scheduler_extender.openapi import DOCUMENT, METRICS_LISTENER
from tests.fuzzing.http_fuzz import Answer, Surface, fuzz_operation

ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "e2e" / "fleets" / "sample.yaml"
STARTUP_TIMEOUT_S = 60
HELD_UID = "uid-offline"
QUANTITIES = ["0", "1", "2", "8", "30", "100", "4096", "20k", "81920", "1Gi", "-1", "1.5"]


def named_field(answer: Answer) -> str | None:
    """The field a refusal names: `Error` is "field: reason"; a body too large names it all."""
    if answer.status == 413:
        return "body"
    doc = answer.json()
    error = doc.get(protocol.ERROR) if isinstance(doc, dict) else None
    if not isinstance(error, str) or ": " not in error:
        return None
    return error.split(": ", 1)[0]


def hidden_failure(answer: Answer) -> str | None:
    """A 200 carrying "internal error" is an exception the extender caught and answered."""
    doc = answer.json()
    error = doc.get(protocol.ERROR) if isinstance(doc, dict) else None
    if isinstance(error, str) and error.startswith("internal error"):
        return f"an exception was answered as {error[:200]!r}"
    return None


def reaching(names: list[str]) -> dict[str, Any]:
    """The document with node names and quantities biased to ones this process holds and
    reads, so bodies the schema allows reach placement and not only the cache's miss."""
    doc = copy.deepcopy(DOCUMENT)
    name = {"anyOf": [{"enum": names}, {"type": "string", "minLength": 1}]}
    for _, _, schema in operations(doc):
        props = (schema or {}).get("properties", {})
        if protocol.NODE_NAMES in props:
            props[protocol.NODE_NAMES]["items"] = name
        if protocol.NODE in props:
            props[protocol.NODE] = name
        for victims in (protocol.NODE_TO_VICTIMS, protocol.NODE_TO_META_VICTIMS):
            if victims in props:
                props[victims] = _keyed_by(props[victims], names)
        _quantities(schema or {})
    return doc


def _keyed_by(table: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """A map keyed by node name, drawn with entries under these names (the schema drawer
    leaves `additionalProperties` maps empty), its victims' uids biased to the held pod's."""
    entry = copy.deepcopy(table["additionalProperties"])
    pod = entry["properties"][protocol.VICTIM_PODS]["items"]
    uid = {"anyOf": [{"enum": [HELD_UID]}, {"type": "string", "minLength": 1}]}
    if protocol.UID in pod["properties"]:
        pod["properties"][protocol.UID] = uid
    else:
        pod["properties"]["metadata"]["properties"]["uid"] = uid
    return {"type": "object", "properties": {n: entry for n in names}}


def _quantities(schema: dict[str, Any]) -> None:
    for key, sub in list(schema.get("properties", {}).items()):
        if sub.get("description", "").startswith("a Kubernetes quantity"):
            schema["properties"][key] = {"anyOf": [{"enum": QUANTITIES}, sub]}
        else:
            _quantities(sub)
    if isinstance(schema.get("items"), dict):
        _quantities(schema["items"])


@pytest.fixture(scope="module")
def extender():
    """The extender process; it must still be serving when the fuzzing ends."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.fuzzing.test_extender"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], STARTUP_TIMEOUT_S)
        ports = json.loads(proc.stdout.readline() or "{}") if ready else {}
        assert ports, f"the extender did not start (exit {proc.poll()})"
        yield ports
        assert proc.poll() is None, f"the extender exited with {proc.returncode}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def surfaces(ports: dict[str, Any]) -> dict[str, Surface]:
    doc = reaching(ports["names"])
    return {
        listener: Surface(
            "extender",
            f"http://127.0.0.1:{ports[listener]}",
            doc,
            named_field,
            hidden_failure=hidden_failure,
        )  # fmt: skip
        for listener in ("verbs", "metrics")
    }


OPERATIONS = [(method, path) for method, path, _ in operations(DOCUMENT)]
EXAMPLES = {"post": 800, "get": 25}


@pytest.mark.parametrize("method, path", OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_every_operation_of_the_extender_survives_hostile_input(
    extender, fuzz_budget, method, path
):
    tags = DOCUMENT["paths"][path][method]["tags"]
    listener = "metrics" if tags == [METRICS_LISTENER] else "verbs"
    surface = surfaces(extender)[listener]
    fuzz_operation(surface, method, path, fuzz_budget(EXAMPLES[method]))


# The process.


def cache_of_the_sample_fleet():
    """The cache as a first list leaves it: the fleet's nodes, one unreadable node, and one
    running pod holding a whole GPU on a100-0 (a victim preemption may weigh)."""
    from infergrid.assignment_annotation import (
        AssignedGpu,
        ContainerAssignment,
        PodAssignment,
        encode_assignment,
    )
    from infergrid.constants import (
        ANNOTATION_GPU_ASSIGNMENT,
        ANNOTATION_GPU_INVENTORY,
        ANNOTATION_GPU_USAGE,
        SCHEDULER_NAME,
    )
    from infergrid.fleet import load_fleet
    from infergrid.inventory import encode_inventory
    from infergrid.placement import idle_usage
    from infergrid.usage import encode_usage
    from scheduler_extender.watch_cache import ClusterCache

    now = datetime.now(UTC)
    fleet = load_fleet(SAMPLE)
    nodes = [
        {"metadata": {"name": n.name, "annotations": {
            ANNOTATION_GPU_INVENTORY: encode_inventory(n.inventory),
            ANNOTATION_GPU_USAGE: encode_usage(idle_usage(n.inventory, now)),
        }}}
        for n in fleet.nodes
    ]  # fmt: skip
    nodes.append({"metadata": {"name": "broken", "annotations": {ANNOTATION_GPU_INVENTORY: "{"}}})
    a100 = next(n for n in fleet.nodes if n.name == "a100-0").inventory.gpus[0].uuid
    engine = ContainerAssignment("engine", gpus=(AssignedGpu(a100, 81920, 100),))
    held = PodAssignment("a100-0", now, (engine,))
    running = {
        "metadata": {"uid": HELD_UID, "name": "offline", "namespace": "default",
                     "resourceVersion": "1",
                     "annotations": {ANNOTATION_GPU_ASSIGNMENT: encode_assignment(held)}},
        "spec": {"nodeName": "a100-0", "schedulerName": SCHEDULER_NAME, "priority": 0},
        "status": {"phase": "Running"},
    }  # fmt: skip
    cache = ClusterCache()
    cache.replace_all_nodes(nodes)
    cache.replace_all_pods([running])
    cache.replace_all_slices([])
    cache.replace_all_claims([])
    return cache


class MissingPods:
    """The API server across the seam: every pod read is a 404."""

    def read_namespaced_pod(self, name, namespace, **_):
        from kubernetes.client.rest import ApiException

        raise ApiException(status=404, reason="Not Found")


async def refuse_eviction(namespace: str, name: str, uid: str) -> str | None:
    return "the fuzzer's API server refuses evictions"


async def announce_nothing(pod, reason: str, message: str, kind: str = "Normal") -> None:
    return None


async def serve() -> None:
    """Both listeners on loopback ports of the kernel's choosing; prints them, then serves."""
    from scheduler_extender.app import ExtenderService
    from scheduler_extender.binder import Binder
    from scheduler_extender.config import ExtenderConfig
    from scheduler_extender.main import listen
    from scheduler_extender.pending_binds import BindBarrier
    from scheduler_extender.preemptor import Preemptor
    from scheduler_extender.tentative import Reserver
    from scheduler_extender.view import PlacementView

    cfg = ExtenderConfig()
    cache = cache_of_the_sample_fleet()
    view = PlacementView(cache, timedelta(seconds=cfg.stale_after_s))
    view.prepare(datetime.now(UTC))  # as main.py does once synced: the process is ready
    barrier = BindBarrier(cfg.bind_wait_s)
    binder = Binder(MissingPods(), view, cfg.default_policy, decided=barrier.decided)
    service = ExtenderService(
        view, binder, cfg.default_policy, lambda: True, barrier=barrier,
        reserver=Reserver(view, cfg.default_policy, cfg.tentative_reservation_s),
        preemptor=Preemptor(view, cfg.default_policy, refuse_eviction, announce_nothing,
                            cfg.preemption_hold_s, preemptible=cfg.preemptible()),
        preemptible=cfg.preemptible(),
    )  # fmt: skip
    verbs = await listen(service.app(), "127.0.0.1", 0)
    metrics = await listen(service.metrics_app(), "127.0.0.1", 0)
    ports = {
        "verbs": verbs.addresses[0][1],
        "metrics": metrics.addresses[0][1],
        "names": sorted(cache.nodes()),
    }
    print(json.dumps(ports), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(serve())
