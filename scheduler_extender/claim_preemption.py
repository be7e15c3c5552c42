"""Preemption for pods whose claims no DRA node can take now.

kube-scheduler's DRA plugin refuses every node for a claim it cannot allocate, and then asks
no extender: extenders see only the nodes its own filters passed. Its own preemption frees no
DRA devices either (the DRA plugin has no dry run of removing pods). So filter never sees such
a pod, and the preemption filter leads (``preemptor.py``) would never start for it.

The leader finds those pods itself instead: every ``interval_s`` it lists the pending pods
that ask for their GPUs by claim (``infergrid.io/gpu-claim``) and that kube-scheduler marked
Unschedulable, and hands each to the same preemptor, over the DRA nodes: the cheapest
lower-priority victims of a preemptible class are evicted, and the room is held for the pod
until its claims can be allocated there. Choosing the pods is ``waiting_for_claims``, pure.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Final

from kubernetes import client
from kubernetes.client.rest import ApiException
from urllib3.exceptions import HTTPError

from infergrid.pod_request import asks_claims
from scheduler_extender.preemptor import Preemptor

log = logging.getLogger(__name__)

PENDING: Final = "spec.nodeName=,status.phase=Pending"
"""The field selector of pods no node has yet."""
INTERVAL_S: Final = 5.0

ListPending = Callable[[], Awaitable[list[dict[str, Any]]]]


def unschedulable(pod: dict[str, Any]) -> bool:
    """Whether kube-scheduler tried the pod and found no node (its PodScheduled condition)."""
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if isinstance(condition, dict) and condition.get("type") == "PodScheduled":
            return condition.get("status") == "False" and condition.get("reason") == "Unschedulable"
    return False


def waiting_for_claims(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The pods, of those listed, that wait for claims no node could take: unbound, not being
    deleted, asking for claims, refused by kube-scheduler. Oldest first, so the pod that
    waited longest preempts first, as kube-scheduler's queue would take it."""
    found = [
        p
        for p in pods
        if not (p.get("spec") or {}).get("nodeName")
        and not (p.get("metadata") or {}).get("deletionTimestamp")
        and asks_claims(p)
        and unschedulable(p)
    ]
    return sorted(found, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp")))


def pending_lister(core: client.CoreV1Api) -> ListPending:
    """Lists every pending pod from the API server, as the pod JSON filter receives."""

    async def list_pending() -> list[dict[str, Any]]:
        answer = await asyncio.to_thread(
            core.list_pod_for_all_namespaces,
            field_selector=PENDING,
            _preload_content=False,
            _request_timeout=(5, 30),
        )
        return json.loads(answer.data).get("items") or []

    return list_pending


async def preempt_for_claims(
    list_pending: ListPending,
    preemptor: Preemptor,
    dra_nodes: Callable[[], list[str]],
    clock: Callable[[], datetime],
    is_leader: Callable[[], bool],
    stop: threading.Event,
    interval_s: float = INTERVAL_S,
) -> None:
    """Runs until ``stop``: each round, while leading, one preemption plan for each waiting
    claim pod (the preemptor keeps at most one plan a pod per hold window)."""
    while not stop.is_set():
        await asyncio.sleep(interval_s)
        if not is_leader():
            continue
        try:
            pods = waiting_for_claims(await list_pending())
        except (ApiException, HTTPError, OSError, ValueError) as err:
            log.warning("listing the pending pods failed, trying again: %s", err)
            continue
        await preempt_round(pods, preemptor, dra_nodes(), clock())


async def preempt_round(
    pods: list[dict[str, Any]], preemptor: Preemptor, nodes: list[str], now: datetime
) -> None:
    """One plan per pod over ``nodes``, its evictions run before the next pod plans, so two
    waiting pods never choose the same victims."""
    for pod in pods:
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        preemptor.new_cycle(uid)
        plan = preemptor.plan(pod, nodes, now)
        if plan is not None and plan.evict:
            await preemptor.evict_all(pod, plan)
