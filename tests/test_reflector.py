"""The list+watch loop against a scripted list function: no cluster, no real sleeps."""

from __future__ import annotations

import functools
import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from infergrid import reflector
from infergrid.reflector import Reflector, Source


def obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


def listing(items: list[dict], version: str = "10", more: str | None = None) -> SimpleNamespace:
    """A list answer read with _preload_content=False: its JSON body in ``.data``."""
    metadata: dict[str, Any] = {"resourceVersion": version}
    if more is not None:
        metadata["continue"] = more
    return SimpleNamespace(data=json.dumps({"metadata": metadata, "items": items}).encode())


class WatchBody:
    """A watch answer as urllib3 gives it: JSON lines, then close() and release_conn()."""

    def __init__(self, events: list[dict]) -> None:
        self.lines = [b"\n"] + [json.dumps(e).encode() + b"\n" for e in events]  # blank: skipped
        self.closed = self.released = False

    def __iter__(self):
        return iter(self.lines)

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        self.released = True


def event(kind: str, name: str, version: str) -> dict:
    return {"type": kind, "object": obj(name, version)}


def gone() -> dict:
    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
    return {"type": "ERROR", "object": status}


class ScriptedList:
    """A list function answering lists and watches from one script, in order; once the
    script runs out it sets ``stop`` and answers an empty watch (or list); an idle one
    instead waits a moment for someone else to set it."""

    def __init__(self, script: list, stop: threading.Event, idle: bool = False) -> None:
        self.script = list(script)
        self.stop = stop
        self.idle = idle
        self.calls: list[dict[str, Any]] = []

    def __call__(self, *args: Any, **params: Any) -> Any:
        self.calls.append({"args": args, **params})
        if not self.script:
            if self.idle:
                self.stop.wait(0.01)
            else:
                assert len(self.calls) < 50, "the loop did not stop"
                self.stop.set()
            return WatchBody([]) if params.get("watch") else listing([])
        answer = self.script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, WatchBody) == bool(params.get("watch")), params
        return answer

    def watches(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if c.get("watch")]

    def lists(self) -> list[dict[str, Any]]:
        return [c for c in self.calls if not c.get("watch")]


class Owner:
    """What a cache sees: replaces and events, in order."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []
        self.marks = 0

    def replace(self, items: list[dict], mark: Any) -> None:
        self.seen.append(("replace", [i["metadata"]["name"] for i in items], mark))

    def apply(self, kind: str, item: dict) -> None:
        self.seen.append((kind, item["metadata"]["name"]))

    def mark(self) -> int:
        self.marks += 1
        self.seen.append(("mark", self.marks))
        return self.marks

    def source(self, list_fn, **params: Any) -> Source:
        return Source("things", list_fn, params, self.replace, self.apply, self.mark)


class CountingStop(threading.Event):
    """A stop event that records each backoff's length instead of sleeping through it."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return self.is_set()


def test_a_list_then_a_watch_applies_the_events_in_order():
    stop = threading.Event()
    body = WatchBody(
        [event("ADDED", "c", "11"), event("MODIFIED", "a", "12"), event("DELETED", "b", "13")]
    )
    fake = ScriptedList([listing([obj("a", "3"), obj("b", "4")], "10"), body], stop)
    owner = Owner()
    Reflector(watch_timeout_s=7).run(owner.source(fake), stop)
    assert owner.seen[:5] == [
        ("mark", 1),
        ("replace", ["a", "b"], 1),
        ("ADDED", "c"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    first, watch = fake.calls[0], fake.calls[1]
    assert first["limit"] == reflector.LIST_PAGE and first["_preload_content"] is False
    assert first["_request_timeout"] == (reflector.CONNECT_TIMEOUT_S, 60.0)
    assert "watch" not in first and "resource_version" not in first
    assert watch["watch"] is True and watch["resource_version"] == "10"
    assert watch["timeout_seconds"] == 7 and watch["allow_watch_bookmarks"] is True
    assert watch["_preload_content"] is False
    assert watch["_request_timeout"] == (reflector.CONNECT_TIMEOUT_S, 7 + reflector.READ_SLACK_S)
    assert "limit" not in watch
    assert body.closed and body.released
    # The next watch goes on from the last event's version, without a relist.
    assert fake.watches()[1]["resource_version"] == "13"
    assert len(fake.lists()) == 1


def test_a_410_error_event_relists_and_watches_from_the_new_list():
    stop = CountingStop()
    reconnects = []
    fake = ScriptedList(
        [
            listing([obj("a", "3")], "10"),
            WatchBody([event("ADDED", "b", "11"), gone(), event("ADDED", "never", "12")]),
            listing([obj("a", "3"), obj("b", "11"), obj("c", "19")], "20"),
            WatchBody([event("DELETED", "a", "21")]),
        ],
        stop,
    )
    owner = Owner()
    Reflector(on_reconnect=lambda: reconnects.append(1)).run(owner.source(fake), stop)
    assert owner.seen == [
        ("mark", 1),
        ("replace", ["a"], 1),
        ("ADDED", "b"),
        ("mark", 2),
        ("replace", ["a", "b", "c"], 2),
        ("DELETED", "a"),
    ]
    assert [c.get("resource_version") for c in fake.calls[:4]] == [None, "10", None, "20"]
    assert len(reconnects) == 1
    assert stop.waits == []  # Gone relists at once: no backoff


def test_a_list_follows_continue_across_pages_with_the_sources_params():
    stop = threading.Event()
    fake = ScriptedList(
        [
            listing([obj("a", "1"), obj("b", "2")], "8", more="page-2"),
            listing([obj("c", "3")], "9", more="page-3"),
            listing([], "10", more=""),
            WatchBody([]),
        ],
        stop,
    )
    owner = Owner()
    source = owner.source(functools.partial(fake, "team-a"), field_selector="x=y")
    Reflector().run(source, stop)
    assert owner.seen[:2] == [("mark", 1), ("replace", ["a", "b", "c"], 1)]
    pages = fake.calls[:3]
    assert [p.get("_continue") for p in pages] == [None, "page-2", "page-3"]
    assert all(p["limit"] == reflector.LIST_PAGE for p in pages)
    assert all(c["args"] == ("team-a",) and c["field_selector"] == "x=y" for c in fake.calls)
    assert fake.calls[3]["resource_version"] == "10"  # the last page's version
    assert "_continue" not in fake.calls[3] and "limit" not in fake.calls[3]


def test_a_bookmark_moves_the_version_without_applying_anything():
    stop = threading.Event()
    bookmark = {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "31"}}}
    fake = ScriptedList([listing([], "10"), WatchBody([bookmark])], stop)
    owner = Owner()
    Reflector().run(owner.source(fake), stop)
    assert owner.seen == [("mark", 1), ("replace", [], 1)]
    assert [c["resource_version"] for c in fake.watches()] == ["10", "31"]


def test_stop_ends_the_loop_mid_stream_and_closes_the_stream():
    stop = threading.Event()
    body = WatchBody([event("ADDED", "a", "11"), event("ADDED", "b", "12")])
    fake = ScriptedList([listing([], "10"), body], stop)
    owner = Owner()

    def apply_then_stop(kind: str, item: dict) -> None:
        owner.apply(kind, item)
        stop.set()

    source = Source("things", fake, {}, owner.replace, apply_then_stop, owner.mark)
    Reflector().run(source, stop)
    assert owner.seen == [("mark", 1), ("replace", [], 1), ("ADDED", "a")]
    assert body.closed and body.released
    assert len(fake.calls) == 2


def test_start_runs_a_daemon_thread_per_source_until_stop_is_set():
    stop = threading.Event()
    listed = [threading.Event(), threading.Event()]
    fakes = [ScriptedList([listing([obj(f"o{i}", "1")], "1")], stop, idle=True) for i in (0, 1)]
    sources = [
        Source(f"kind{i}", fakes[i], {}, lambda items, mark, i=i: listed[i].set(), print)
        for i in (0, 1)
    ]
    threads = Reflector().start(sources, stop)
    try:
        assert len(threads) == 2 and all(t.daemon and t.is_alive() for t in threads)
        assert all(event.wait(5) for event in listed)
    finally:
        stop.set()
    for thread in threads:
        thread.join(5)
    assert not any(t.is_alive() for t in threads)


def test_a_failing_list_fn_backs_off_doubling_to_the_cap_then_starts_over(monkeypatch):
    monkeypatch.setattr(reflector, "BACKOFF_FIRST_S", 0.25)
    monkeypatch.setattr(reflector, "BACKOFF_MAX_S", 0.75)
    stop = CountingStop()
    reconnects = []
    fake = ScriptedList(
        [
            ApiException(status=500, reason="boom"),
            ConnectionError("refused"),
            ValueError("bad body"),
            listing([obj("a", "1")], "10"),
            WatchBody([]),
            WatchBody([{"type": "ERROR", "object": {"code": 500, "reason": "x", "message": "y"}}]),
            WatchBody([event("ADDED", "b", "11")]),
        ],
        stop,
    )
    owner = Owner()
    Reflector(on_reconnect=lambda: reconnects.append(1)).run(owner.source(fake), stop)
    assert stop.waits == [0.25, 0.5, 0.75, 0.25]  # a success resets the backoff
    assert len(reconnects) == 4
    marks = [("mark", n) for n in (1, 2, 3, 4)]  # one before every try at listing
    assert owner.seen == [*marks, ("replace", ["a"], 4), ("ADDED", "b")]
    # A watch that failed, other than with Gone, resumes from the version it had: no relist.
    assert [c.get("resource_version") for c in fake.calls[3:]] == [None, "10", "10", "10", "11"]


def test_a_broken_stream_is_closed_logged_and_reconnected(caplog):
    stop = CountingStop()
    reconnects = []

    class Broken(WatchBody):
        def __iter__(self):
            yield json.dumps(event("ADDED", "a", "11")).encode()
            raise ConnectionResetError("reset")

    broken = Broken([])
    fake = ScriptedList([listing([], "10"), broken], stop)
    owner = Owner()
    with caplog.at_level("WARNING", logger=reflector.__name__):
        Reflector(on_reconnect=lambda: reconnects.append(1)).run(owner.source(fake), stop)
    assert owner.seen == [("mark", 1), ("replace", [], 1), ("ADDED", "a")]
    assert broken.closed and broken.released
    assert len(reconnects) == 1
    assert "things list+watch failed" in caplog.text


def test_every_resync_relists():
    stop = threading.Event()
    fake = ScriptedList(
        [listing([obj("a", "1")], "10"), WatchBody([]), listing([], "20"), WatchBody([])], stop
    )
    owner = Owner()
    Reflector(resync_s=0.0).run(owner.source(fake), stop)
    assert owner.seen[:4] == [("mark", 1), ("replace", ["a"], 1), ("mark", 2), ("replace", [], 2)]
    assert [c.get("resource_version") for c in fake.calls[:4]] == [None, "10", None, "20"]


def test_a_source_without_a_mark_replaces_with_none():
    stop = threading.Event()
    got = []
    fake = ScriptedList([listing([obj("a", "1")], "10")], stop)
    source = Source("nodes", fake, {}, lambda items, mark: got.append((len(items), mark)), None)
    Reflector().run(source, stop)
    assert got[0] == (1, None)


def test_a_source_is_frozen():
    source = Source("nodes", print, {}, print, print)
    with pytest.raises(AttributeError):
        source.kind = "pods"  # type: ignore[misc]
