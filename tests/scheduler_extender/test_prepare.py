"""At start the extender builds every node's placement state before it says it is ready, so
no pod's filter pays for building thousands of them, and that work is frozen out of garbage
collection with the cache."""

from __future__ import annotations

import asyncio
import gc
import threading
from datetime import timedelta

import pytest
from aiohttp.test_utils import TestClient, TestServer

from scheduler_extender import decisions
from scheduler_extender import view as view_module
from scheduler_extender.app import ExtenderService
from scheduler_extender.binder import Binder
from scheduler_extender.main import prepare_when_synced
from scheduler_extender.view import PlacementView
from scheduler_extender.watch_cache import ClusterCache
from tests.scheduler_extender.test_view_changes import NOW, node_json, share_pod

NAMES = [f"n{i}" for i in range(5)]


@pytest.fixture()
def view() -> PlacementView:
    cache = ClusterCache()
    cache.replace_all_nodes([node_json(name) for name in NAMES])
    cache.replace_all_pods([])
    cache.replace_all_slices([])
    cache.replace_all_claims([])
    return PlacementView(cache, timedelta(days=1))


def test_prepare_builds_every_node_so_a_filter_over_them_builds_none(view, monkeypatch):
    assert view.prepare(NOW) == len(NAMES) and view.prepared
    built = []
    original = view_module.build_node_state
    monkeypatch.setattr(view_module, "build_node_state", lambda *a: built.append(a) or original(*a))
    out = decisions.filter_nodes(share_pod(4096), NAMES, view, "binpack", NOW)
    assert out.passed == NAMES and built == []


def test_readyz_says_ready_only_once_the_states_are_built(view):
    svc = ExtenderService(view, Binder(None, view, "binpack"), "binpack", lambda: True)

    async def readyz() -> int:
        async with TestClient(TestServer(svc.app())) as http:
            return (await http.get("/readyz")).status

    assert view.cache.synced() and asyncio.run(readyz()) == 503
    view.prepare(NOW)
    assert asyncio.run(readyz()) == 200


def test_once_synced_the_states_are_built_then_frozen_out_of_collection(view):
    try:
        asyncio.run(prepare_when_synced(view, threading.Event()))
        assert view.prepared and gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
