"""Bind: re-check, record the assignment, create the Binding, all under the node's lock.

What is placed is the pod as the API server holds it (read back at bind), never a body a
caller sent: /filter's body only lets bind reserve early, and that reservation is kept
only when the read-back pod asks for the same GPUs. A pod already bound is refused. The
assignment annotation is written with the pod's resourceVersion as a precondition, so a
pod changed since it was read is not bound on stale facts. The reservation goes into the
cache before the write, so filters of other pods already see the GPUs taken; on any
failure it is released, and an annotation already written is removed again, but only
while it still holds what this bind wrote (another bind may have written since).
`decided` is told as soon as the reservation is in the cache (and again, on every path,
when bind ends): the filters waiting for this pod's bind (`pending_binds`) go on from
there.

A tentative reservation that prioritize made for the pod (`tentative`) is the early one when
it is on the bind's node (confirmed); on another node it is released and the pod placed on
the bind's node from the same request (moved). Either way the read-back pod decides as above.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from infergrid.assignment_annotation import PodAssignment, decode_assignment, encode_assignment
from infergrid.constants import ANNOTATION_GPU_ASSIGNMENT
from infergrid.errors import ContractError
from infergrid.placement import fit, resolve_policy, to_pod_assignment
from infergrid.pod_request import PodGpuRequest, parse_pod_request
from scheduler_extender import metrics
from scheduler_extender.protocol import BindingArgs
from scheduler_extender.tentative import bind_outcome
from scheduler_extender.view import PlacementView

log = logging.getLogger(__name__)

Early = tuple[PodGpuRequest, PodAssignment]
"""A reservation made from /filter's body, with the request it was placed from."""


class BindError(Exception):
    """Bind refused; the message goes back to kube-scheduler in the Error field."""

    def __init__(self, cause: str, message: str):
        super().__init__(message)
        self.cause = cause


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
        from it at once, before the pod is read back, and the filters waiting for this bind go
        on sooner. The read-back pod decides: a different GPU request is placed anew. When an
        earlier bind of this pod left its reservation in the cache (the watch has not caught
        up), a second bind reserves nothing early, and its `already-bound` refusal leaves that
        reservation alone: the pod holds those GPUs.
        """
        lock = self._locks.setdefault(args.node, asyncio.Lock())
        try:
            async with lock:
                held = self.view.cache.reserved(args.pod_uid)
                early = None if held else self._early(args, filtered)
                try:
                    pod = await self._call(self._read_pod, args)
                    return await self._bind_locked(args, pod, early)
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
            return (tentative.request, tentative.assignment)
        metrics.TENTATIVE_RESERVATIONS.labels("moved").inc()
        self.view.cache.release(args.pod_uid)
        try:
            return (tentative.request, self._reserve(args, tentative.request))
        except BindError:
            return None  # the read-back pod is placed, or refused, as without a hold

    def _reserve_early(self, args: BindingArgs, filtered: dict[str, Any] | None) -> Early | None:
        """The placement from the filtered pod, reserved; None where the read-back pod must
        decide (none kept, another uid, nothing to place, an invalid request, no longer fits)."""
        if filtered is None:
            return None
        try:
            request, to_place = self._request(args, filtered)
            return (request, self._reserve(args, request)) if to_place else None
        except BindError:
            return None

    async def _bind_locked(
        self, args: BindingArgs, pod: dict[str, Any], early: Early | None
    ) -> str:
        """Bind's API work; on any failure `bind` releases the reservation."""
        request, to_place = self._request(args, pod)
        if not to_place:
            self.view.cache.release(args.pod_uid)  # an early reservation, if any, is not needed
            await self._call(self._create_binding, args)
            return request.policy
        written = encode_assignment(self._placement(args, request, early))
        try:
            await self._call(self._annotate, args, pod["metadata"]["resourceVersion"], written)
        except ApiException as err:
            cause = "conflict" if err.status == 409 else "api"
            raise BindError(cause, f"could not record the assignment: {_api_reason(err)}") from None
        try:
            await self._call(self._create_binding, args)
        except ApiException as err:
            await self._call(self._unannotate, args, written)
            raise BindError("binding", f"could not bind: {_api_reason(err)}") from None
        return request.policy

    def _placement(self, args: BindingArgs, request: PodGpuRequest, early: Early | None):
        """The early reservation when the read-back pod asks for what the filtered body asked;
        otherwise that reservation goes and the read-back request is placed."""
        if early is not None and early[0] == request:
            return early[1]
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
            raise BindError(
                "already-bound",
                f"pod {args.pod_namespace}/{args.pod_name} is already bound to node {bound_to}",
            )
        try:
            request = parse_pod_request(pod, self.default_policy)
        except ContractError as err:
            raise BindError("invalid-request", f"invalid GPU request: {err}") from None
        existing = _existing_assignment(meta)
        recorded = existing is not None and existing.node == args.node
        return request, bool(request.gpu_containers) and not recorded

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

    def _annotate(self, args: BindingArgs, resource_version: str, written: str) -> None:
        body = {
            "metadata": {
                "resourceVersion": resource_version,
                "annotations": {ANNOTATION_GPU_ASSIGNMENT: written},
            }
        }
        # The answer (the whole pod) is not read: building client objects from it cost more
        # than the call itself.
        self.core.patch_namespaced_pod(
            args.pod_name, args.pod_namespace, body, _preload_content=False
        )

    def _unannotate(self, args: BindingArgs, written: str) -> None:
        """Removes the annotation only while it holds `written` (a JSON patch `test` op): if
        another bind wrote since, its assignment is left in place."""
        try:
            self.core.patch_namespaced_pod(
                args.pod_name, args.pod_namespace, unannotate_patch(written),
                _preload_content=False,
            )  # fmt: skip
        except ApiException as err:
            log.warning(
                "left the assignment of %s/%s in place (another bind may have written since): %s",
                args.pod_namespace, args.pod_name, _api_reason(err),
            )  # fmt: skip

    def _create_binding(self, args: BindingArgs) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": args.pod_name, "uid": args.pod_uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": args.node},
        }
        self.core.create_namespaced_pod_binding(
            args.pod_name, args.pod_namespace, body, _preload_content=False
        )


ASSIGNMENT_POINTER = "/metadata/annotations/" + ANNOTATION_GPU_ASSIGNMENT.replace(
    "~", "~0"
).replace("/", "~1")
"""The annotation's JSON pointer (RFC 6901: `~` and `/` escaped)."""


def unannotate_patch(written: str) -> list[dict[str, str]]:
    """A JSON patch that removes the assignment annotation only if it still holds `written`."""
    return [
        {"op": "test", "path": ASSIGNMENT_POINTER, "value": written},
        {"op": "remove", "path": ASSIGNMENT_POINTER},
    ]


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
