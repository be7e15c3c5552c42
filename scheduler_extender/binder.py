"""Bind: re-check and bind, with the assignment, in one API call, under the node's lock.

The assignment rides on the Binding: the API server copies a Binding's annotations onto its
pod in the same write that sets `spec.nodeName`, and honours the Binding's `metadata.uid` and
`resourceVersion` as preconditions (kube-apiserver, `BindingREST.Create`). So a pod is either
bound carrying its assignment, or left as it was: no annotation to undo after a failed bind.

The pod comes from the extender's watch cache where it can: when the request placed is the
one kube-scheduler sent for this pod in this cycle (the tentative reservation prioritize made,
or the body /filter kept) and the cache holds the pod unbound and unassigned, one POST binds
it, with the cached uid and resourceVersion as preconditions. Otherwise, and after a 409 (the
cache was behind: the pod changed, was bound, or was replaced), the pod is read from the API
server and decides: a different GPU request is placed anew, a pod already bound is refused, a
pod whose assignment on this node is already recorded (a retried bind) keeps it; then one more
POST, with that read's resourceVersion. The reservation goes into the cache before the POST, so
filters of other pods already see the GPUs taken; on any failure it is released.
`decided` is told as soon as the reservation is in the cache (and again, on every path, when
bind ends): the filters waiting for this pod's bind (`pending_binds`) go on from there.

What the one-call path trusts: the request comes from kube-scheduler's own body of the pod
(the verbs listen on loopback only), and where /filter's body was kept, its resourceVersion must
be the cached one. A tentative hold keeps no version, so a placement annotation changed between
prioritize and bind is placed as it was when the pod was scheduled, as kube-scheduler's own
bind acts on its snapshot; a container's GPU resources cannot change on a live pod.

A pod whose GPUs come by claim is bound with no assignment: kube-scheduler's DRA plugin wrote
its claims' allocation in PreBind, and the watch cache counts that allocation as its holding
(a tentative hold confirmed here lasts until then).

A tentative reservation that prioritize made for the pod (`tentative`) is the early one when
it is on the bind's node (confirmed); on another node it is released and the pod placed on
the bind's node from the same request (moved).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NamedTuple

from kubernetes import client
from kubernetes.client.rest import ApiException

from infergrid.assignment_annotation import PodAssignment, decode_assignment, encode_assignment
from infergrid.constants import ANNOTATION_GPU_ASSIGNMENT
from infergrid.errors import ContractError
from infergrid.placement import fit, resolve_policy, to_pod_assignment
from infergrid.pod_request import PodGpuRequest
from scheduler_extender import metrics
from scheduler_extender.protocol import BindingArgs
from scheduler_extender.tentative import bind_outcome
from scheduler_extender.view import PlacementView

log = logging.getLogger(__name__)


class Early(NamedTuple):
    """A reservation made before the pod is read: the request it was placed from (kube-
    scheduler's body of this cycle), and that body's resourceVersion where it was kept (a
    tentative hold keeps none)."""

    request: PodGpuRequest
    assignment: PodAssignment
    version: str | None = None


class BindError(Exception):
    """Bind refused; the message goes back to kube-scheduler in the Error field."""

    def __init__(self, cause: str, message: str):
        super().__init__(message)
        self.cause = cause


@dataclass(frozen=True, slots=True)
class Plan:
    """One Binding to create: the policy placed by, the resourceVersion it requires of the pod
    ("" for none), and the assignment it carries (None: nothing to write)."""

    policy: str
    resource_version: str
    written: str | None


class _Conflict(Exception):
    """The API server answered 409: the pod is not as the Binding's preconditions said."""


@dataclass
class Binder:
    core: client.CoreV1Api
    view: PlacementView
    default_policy: str
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    decided: Callable[[str], None] = lambda uid: None

    def __post_init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    async def bind(self, args: BindingArgs, filtered: dict[str, Any] | None = None) -> str:
        """Binds and returns the policy used; raises BindError with the reason otherwise.

        `filtered` is the pod as kube-scheduler sent it to filter: its placement is reserved
        from it at once, and the filters waiting for this bind go on sooner. When an earlier
        bind of this pod left its reservation in the cache (the watch has not caught up), a
        second bind reserves nothing early, and its `already-bound` refusal leaves that
        reservation alone: the pod holds those GPUs.
        """
        lock = self._locks.setdefault(args.node, asyncio.Lock())
        try:
            async with lock:
                held = self.view.cache.reserved(args.pod_uid)
                early = None if held else self._early(args, filtered)
                try:
                    return await self._bind_locked(args, early)
                except BindError as err:
                    if not (held and err.cause == "already-bound"):
                        self.view.cache.release(args.pod_uid)
                    raise
                except BaseException:
                    self.view.cache.release(args.pod_uid)
                    raise
        finally:
            self.decided(args.pod_uid)

    def _early(self, args: BindingArgs, filtered: dict[str, Any] | None) -> Early | None:
        """The pod's tentative reservation, confirmed or moved to the bind's node; else the
        placement from the filtered pod."""
        tentative = self.view.cache.tentative(args.pod_uid)
        outcome = bind_outcome(None if tentative is None else tentative.node, args.node)
        if tentative is None or outcome == "place":
            return self._reserve_early(args, filtered)
        if outcome == "confirm":
            if not self.view.cache.confirm(args.pod_uid):  # the watch ended it just now
                return self._reserve_early(args, filtered)
            metrics.TENTATIVE_RESERVATIONS.labels("confirmed").inc()
            self.decided(args.pod_uid)
            return Early(tentative.request, tentative.assignment)
        metrics.TENTATIVE_RESERVATIONS.labels("moved").inc()
        self.view.cache.release(args.pod_uid)
        try:
            return Early(tentative.request, self._reserve(args, tentative.request))
        except BindError:
            return None  # the read-back pod is placed, or refused, as without a hold

    def _reserve_early(self, args: BindingArgs, filtered: dict[str, Any] | None) -> Early | None:
        """The placement from the filtered pod, reserved; None where the read-back pod must
        decide (none kept, another uid, nothing to place, an invalid request, no longer fits)."""
        if filtered is None:
            return None
        try:
            request, to_place = self._request(args, filtered)
            if not to_place:
                return None
            version = str((filtered.get("metadata") or {}).get("resourceVersion") or "")
            return Early(request, self._reserve(args, request), version)
        except BindError:
            return None

    async def _bind_locked(self, args: BindingArgs, early: Early | None) -> str:
        """Bind's API work: one POST from the cache where it can, else (and after a conflict)
        a read of the pod and one POST more. On any failure `bind` releases the reservation."""
        cached = self._cached_plan(args, early)
        if cached is not None:
            try:
                return await self._post(args, cached)
            except _Conflict:
                log.debug(
                    "bind of %s/%s: the cache was behind; reading the pod",
                    args.pod_namespace,
                    args.pod_name,
                )
        pod = await self._call(self._read_pod, args)
        try:
            return await self._post(args, self._read_plan(args, pod, early))
        except _Conflict as err:
            raise BindError("conflict", f"could not bind: {err}") from None

    def _cached_plan(self, args: BindingArgs, early: Early | None) -> Plan | None:
        """The Binding for the early placement and the cached pod; None where the pod must be
        read (no early placement, the watch has not shown the pod, or it shows an assignment).
        A pod the cache shows bound is refused: the cache lags the API server, never leads."""
        record = self.view.cache.pod(args.pod_uid)
        if early is None or record is None or not record.resource_version:
            return None
        if record.node_name:
            raise _already_bound(args, record.node_name)
        if record.assignment is not None or record.problem is not None:
            return None
        if early.version is not None and early.version != record.resource_version:
            return None  # the body kept is not the pod the cache holds: read which is current
        if early.request.by_claim:  # its claims' allocation is its assignment
            return Plan(early.request.policy, record.resource_version, None)
        written = encode_assignment(early.assignment)
        return Plan(early.request.policy, record.resource_version, written)

    def _read_plan(self, args: BindingArgs, pod: dict[str, Any], early: Early | None) -> Plan:
        """The Binding for the pod as the API server holds it."""
        request, to_place = self._request(args, pod)
        version = str(pod["metadata"].get("resourceVersion") or "")
        if not to_place:
            self.view.cache.release(args.pod_uid)  # an early reservation, if any, is not needed
            return Plan(request.policy, version, None)
        return Plan(
            request.policy, version, encode_assignment(self._placement(args, request, early))
        )

    async def _post(self, args: BindingArgs, plan: Plan) -> str:
        """Creates the Binding; a 409 is a `_Conflict` (the caller reads the pod), any other
        refusal a BindError."""
        try:
            await self._call(self._create_binding, args, plan)
        except ApiException as err:
            if err.status == 409:
                raise _Conflict(_api_reason(err)) from None
            if err.status == 404:
                raise BindError("pod-missing", f"could not bind: {_api_reason(err)}") from None
            raise BindError("binding", f"could not bind: {_api_reason(err)}") from None
        return plan.policy

    def _placement(self, args: BindingArgs, request: PodGpuRequest, early: Early | None):
        """The early reservation when the read-back pod asks for what the filtered body asked;
        otherwise that reservation goes and the read-back request is placed."""
        if early is not None and early.request == request:
            return early.assignment
        self.view.cache.release(args.pod_uid)
        return self._reserve(args, request)

    def _request(self, args: BindingArgs, pod: dict[str, Any]) -> tuple[PodGpuRequest, bool]:
        """The pod's GPU request, and whether bind must place it: not when it has no GPU
        container, or when its assignment on this node is already recorded (a retried bind).
        A pod already bound is refused: a second bind must not write over the first."""
        meta = pod["metadata"]
        if meta.get("uid") != args.pod_uid:
            raise BindError(
                "pod-replaced", f"pod {args.pod_namespace}/{args.pod_name} was replaced"
            )
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to:
            raise _already_bound(args, bound_to)
        try:
            request = self.view.request_of(pod, self.default_policy)
        except ContractError as err:
            raise BindError("invalid-request", f"invalid GPU request: {err}") from None
        existing = _existing_assignment(meta)
        recorded = existing is not None and existing.node == args.node
        return request, bool(request.gpu_containers) and not recorded and not request.by_claim

    def _reserve(self, args: BindingArgs, request: PodGpuRequest):
        """Places the pod on the node and holds it in the cache: other filters see it now."""
        assignment = self._place(args, request)
        self.view.cache.reserve(args.pod_uid, args.pod_namespace, args.pod_name, assignment)
        self.decided(args.pod_uid)
        return assignment

    def _place(self, args: BindingArgs, request):
        now = self.clock()
        state = self.view.node_state(args.node, now)
        if isinstance(state, str):
            raise BindError("no-inventory", state)
        result = fit(request, state, resolve_policy(request.policy, self.view.workload()))
        if not result.fits:
            reasons = "; ".join(result.reasons)
            raise BindError("no-longer-fits", f"node {args.node} no longer fits: {reasons}")
        return to_pod_assignment(args.node, result.placements, now)

    @staticmethod
    async def _call(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(None, fn, *args)

    def _read_pod(self, args: BindingArgs) -> dict[str, Any]:
        try:
            raw = self.core.read_namespaced_pod(
                args.pod_name, args.pod_namespace, _preload_content=False
            )
        except ApiException as err:
            raise BindError("pod-missing", f"cannot read the pod: {_api_reason(err)}") from None
        return json.loads(raw.data)

    def _create_binding(self, args: BindingArgs, plan: Plan) -> None:
        """One POST: the node, and the assignment as the Binding's only annotation, on the pod
        with this uid at this resourceVersion (empty: no such precondition)."""
        meta: dict[str, Any] = {"name": args.pod_name, "uid": args.pod_uid}
        if plan.resource_version:
            meta["resourceVersion"] = plan.resource_version
        if plan.written is not None:
            meta["annotations"] = {ANNOTATION_GPU_ASSIGNMENT: plan.written}
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        }
        # The answer is read as bytes, not built into client objects (which cost more than
        # the call), and to its end, so that its connection goes back to the pool: left
        # unread, every bind opened a TLS connection of its own, a third of the extender's
        # time in a burst, and the API server's handshakes besides.
        answer = self.core.create_namespaced_pod_binding(
            args.pod_name, args.pod_namespace, body, _preload_content=False
        )
        answer.read()
        answer.release_conn()


def _already_bound(args: BindingArgs, node: str) -> BindError:
    return BindError(
        "already-bound", f"pod {args.pod_namespace}/{args.pod_name} is already bound to node {node}"
    )


def _existing_assignment(meta: dict[str, Any]):
    text = (meta.get("annotations") or {}).get(ANNOTATION_GPU_ASSIGNMENT)
    if text is None:
        return None
    try:
        return decode_assignment(text)
    except ContractError:
        return None


def _api_reason(err: ApiException) -> str:
    try:
        return json.loads(err.body).get("message") or str(err.reason)
    except (TypeError, ValueError):
        return f"{err.status} {err.reason}"
