"""List+watch of one kind of Kubernetes object into its owner's cache, a thread per kind.

Each source is listed (in pages), then watched from the list's resourceVersion; a 410
Gone, or the resync period running out, lists it again, and any other failure backs off
and reconnects. The owner sees only plain Kubernetes JSON: every item of a fresh list
(``replace``) and each event after it (``apply``), so its own logic needs no cluster to
test. The scheduler extender's cache (nodes, pods) and the gateway (InferenceServices,
EndpointSlices, engine pods) both watch through this loop.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from kubernetes.client.rest import ApiException

log = logging.getLogger(__name__)

LIST_PAGE: Final = 500
CONNECT_TIMEOUT_S: Final = 10.0
READ_SLACK_S: Final = 30.0
"""How much longer than the watch's own timeout a silent connection may stay open."""
BACKOFF_FIRST_S: Final = 0.5
BACKOFF_MAX_S: Final = 30.0
HTTP_GONE: Final = 410


@dataclass(frozen=True, slots=True)
class Source:
    """One kind of object listed and watched, and where its events go."""

    kind: str
    """For logs, e.g. "pods"."""
    list_fn: Callable[..., Any]
    """A kubernetes client list function: it accepts watch=, resource_version=,
    timeout_seconds=, allow_watch_bookmarks=, limit=, _continue=, _preload_content= and
    _request_timeout= (positional arguments, such as a namespace, bound by
    functools.partial)."""
    params: dict[str, Any]
    """Extra keyword arguments for ``list_fn`` on every call, e.g. field_selector."""
    replace: Callable[[list[dict[str, Any]], Any], None]
    """(all items of a fresh list, the mark taken just before listing)."""
    apply: Callable[[str, dict[str, Any]], None]
    """(event type ADDED, MODIFIED or DELETED, object)."""
    mark: Callable[[], Any] = lambda: None
    """Called just before each list; its result is passed to ``replace``, so the owner can
    tell what changed while the list was on its way (the extender passes its version)."""


class Reflector:
    """Runs the list+watch loop of each source on its own daemon thread.

    ``on_reconnect`` is called after every failed list or watch, 410 Gone included (the
    owner counts them under its own lock).
    """

    def __init__(
        self,
        resync_s: float = 300.0,
        watch_timeout_s: int = 10,
        on_reconnect: Callable[[], None] = lambda: None,
    ) -> None:
        self.resync_s = resync_s
        self.watch_timeout_s = watch_timeout_s
        self.on_reconnect = on_reconnect

    def start(self, sources: Iterable[Source], stop: threading.Event) -> list[threading.Thread]:
        """One daemon thread per source: list, then watch from the list's resourceVersion;
        relist on 410 Gone and every resync; back off on failures; end soon after stop is set."""
        threads = []
        for source in sources:
            thread = threading.Thread(
                target=self.run, args=(source, stop), name=f"reflect-{source.kind}", daemon=True
            )
            thread.start()
            threads.append(thread)
        return threads

    def run(self, source: Source, stop: threading.Event) -> None:
        """List, then watch from the list's resourceVersion; relist on 410 Gone and every resync.

        Returns soon after ``stop`` is set (within a watch's timeout, or at once while
        backing off).
        """
        resource_version: str | None = None
        due = 0.0
        failures = 0
        while not stop.is_set():
            try:
                if resource_version is None or time.monotonic() >= due:
                    resource_version = self._relist(source)
                    due = time.monotonic() + self.resync_s
                resource_version = self._watch(source, resource_version, stop)
                failures = 0
            except Exception as err:  # noqa: BLE001 - any failure means reconnect; the loop lives
                self.on_reconnect()
                if isinstance(err, ApiException) and err.status == HTTP_GONE:
                    log.info("%s watch expired at %s; relisting", source.kind, resource_version)
                    resource_version = None
                    continue
                delay = min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**failures)
                failures += 1
                log.warning("%s list+watch failed (%s); retrying in %.1fs", source.kind, err, delay)
                stop.wait(delay)

    def _relist(self, source: Source) -> str:
        """Replaces every object of the kind; returns the list's resourceVersion."""
        listed_at = source.mark()
        items: list[dict[str, Any]] = []
        params: dict[str, Any] = dict(source.params, limit=LIST_PAGE)
        while True:
            response = source.list_fn(
                **params, _preload_content=False, _request_timeout=(CONNECT_TIMEOUT_S, 60.0)
            )
            body = json.loads(response.data)
            items += body.get("items") or []
            params["_continue"] = body["metadata"].get("continue")
            if not params["_continue"]:
                break
        source.replace(items, listed_at)
        log.info("listed %d %s", len(items), source.kind)
        return body["metadata"]["resourceVersion"]

    def _watch(self, source: Source, resource_version: str, stop: threading.Event) -> str:
        """Applies events until the watch ends or ``stop``; returns the last resourceVersion.

        The stream is read here, not through ``kubernetes.watch.Watch``: without
        deserializing it fails on ERROR events (such as 410 Gone), and with it
        it builds a model object per event that the owner would throw away.
        """
        response = source.list_fn(
            **source.params,
            watch=True,
            resource_version=resource_version,
            timeout_seconds=self.watch_timeout_s,
            allow_watch_bookmarks=True,
            _preload_content=False,
            _request_timeout=(CONNECT_TIMEOUT_S, self.watch_timeout_s + READ_SLACK_S),
        )
        try:
            for line in response:
                if line.strip():
                    resource_version = _dispatch(source, json.loads(line))
                if stop.is_set():
                    break
        finally:
            response.close()
            response.release_conn()
        return resource_version


def _dispatch(source: Source, event: dict[str, Any]) -> str:
    """Applies one watch event; returns the resourceVersion it brings (a BOOKMARK's only
    moves it). An ERROR event is raised as the ApiException it reports."""
    kind, obj = event["type"], event["object"]
    if kind == "ERROR":
        reason = f"{obj.get('reason')}: {obj.get('message')}"
        raise ApiException(status=obj.get("code"), reason=reason)
    if kind != "BOOKMARK":
        source.apply(kind, obj)
    return obj["metadata"]["resourceVersion"]
