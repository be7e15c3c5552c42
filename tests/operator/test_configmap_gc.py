"""Which old engine ConfigMaps go: those this service controls that no pod runs with and no
Deployment or ReplicaSet may start a pod from; the current spec's are always kept."""

from __future__ import annotations

from inference_operator.configmap_gc import (
    collectable,
    configmaps_in_use,
    mounted_configmaps,
    rollout_settled,
)

UID = "u-1"


def configmap(name: str, owner: str | None = UID) -> dict:
    refs = [{"uid": owner, "controller": True}] if owner else []
    return {"metadata": {"name": name, "uid": f"cm-{name}", "ownerReferences": refs}}


def pod_spec(*configmaps: str) -> dict:
    volumes = [{"name": f"v{i}", "configMap": {"name": c}} for i, c in enumerate(configmaps)]
    return {"volumes": [*volumes, {"name": "cache", "emptyDir": {}}]}


def workload(configmap: str, replicas: int = 1, running: int = 0) -> dict:
    return {"spec": {"replicas": replicas, "template": {"spec": pod_spec(configmap)}},
            "status": {"replicas": running}}  # fmt: skip


def test_only_configmap_volumes_count():
    assert mounted_configmaps(pod_spec("a", "b")) == {"a", "b"}
    assert mounted_configmaps({}) == set()


def test_in_use_covers_deployments_replicasets_with_pods_and_existing_pods():
    replicasets = [
        workload("old-scaling-down", replicas=0, running=1),  # pods still counted
        workload("rolled-back", replicas=1, running=0),  # pods wanted, none yet
        workload("long-gone", replicas=0, running=0),
    ]
    pods = [{"spec": pod_spec("terminating")}]
    used = configmaps_in_use([workload("current")], replicasets, pods)
    assert used == {"current", "old-scaling-down", "rolled-back", "terminating"}


def test_collects_only_our_configmaps_that_nothing_keeps():
    configmaps = [configmap("chat-stable-new"), configmap("chat-stable-old"),
                  configmap("chat-engine"), configmap("theirs", owner="u-2"),
                  configmap("unowned", owner=None)]  # fmt: skip
    keep = {"chat-stable-new"}
    assert collectable(configmaps, UID, keep) == [
        ("chat-stable-old", "cm-chat-stable-old"),
        ("chat-engine", "cm-chat-engine"),  # the single ConfigMap of earlier versions
    ]


def test_a_rollout_settles_when_every_counted_pod_runs_the_current_template():
    def deployment(generation=2, observed=2, updated=2, replicas=2) -> dict:
        return {"metadata": {"generation": generation},
                "status": {"observedGeneration": observed, "updatedReplicas": updated,
                           "replicas": replicas}}  # fmt: skip

    assert rollout_settled(deployment())
    assert not rollout_settled(deployment(observed=1))  # the controller has not seen it yet
    assert not rollout_settled(deployment(updated=1, replicas=2))  # an old pod still counts
    assert rollout_settled({"metadata": {"generation": 0}})  # nothing to roll
