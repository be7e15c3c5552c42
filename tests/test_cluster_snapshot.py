"""`infergrid placements` counts what the extender counts: the same nodes, pods and free memory."""

from datetime import timedelta

from infergrid import placement_table
from infergrid.cluster_snapshot import snapshot_of
from infergrid.constants import ANNOTATION_GPU_INVENTORY, ANNOTATION_GPU_USAGE
from infergrid.placement import NodeState
from scheduler_extender.view import PlacementView
from scheduler_extender.watch_cache import ClusterCache
from tests.test_records import NOW, assignment, gpu_node, node_json, pod_json

STALE_AFTER = timedelta(seconds=30)


def cluster() -> tuple[list[dict], list[dict]]:
    """Two good nodes, one copied from another, one unreadable; live, finished and bad pods."""
    nodes = [
        gpu_node("node-a"),
        gpu_node("node-b"),
        gpu_node("node-c", inventory_of="node-a"),
        node_json("node-d", {ANNOTATION_GPU_INVENTORY: "{", ANNOTATION_GPU_USAGE: "{"}),
        node_json("cpu-0"),
    ]
    pods = [
        pod_json(assignment("node-a")),
        pod_json(assignment("node-b"), phase="Succeeded"),
        pod_json('{"version":"v1"}'),
    ]
    for n, pod in enumerate(pods):
        pod["metadata"].update(uid=f"u{n}", name=f"pod-{n}")
    return nodes, pods


def test_unreadable_and_copied_nodes_are_left_out_and_named():
    nodes, pods = cluster()
    snap = snapshot_of(nodes, pods)
    assert [i.node for i in snap.inventories] == ["node-a", "node-b"]
    assert sorted(snap.usages) == ["node-a", "node-b"]
    named = [p.split(":")[0] for p in snap.problems]
    assert named == ["node node-c", "node node-d", "pod ns/pod-2"]


def test_finished_pods_hold_nothing():
    nodes, pods = cluster()
    assert list(snapshot_of(nodes, pods).assignments) == ["ns/pod-0"]


def test_every_gpu_shows_the_free_memory_the_extender_offers():
    nodes, pods = cluster()
    snap = snapshot_of(nodes, pods)
    rows = placement_table.gpu_rows(
        snap.inventories, snap.usages, snap.assignments, NOW, STALE_AFTER
    )
    cache = ClusterCache()
    cache.replace_all_nodes(nodes)
    cache.replace_all_pods(pods)
    view = PlacementView(cache, STALE_AFTER)
    offered = {}
    for name in cache.nodes():
        state = view.node_state(name, NOW)
        if isinstance(state, NodeState):
            offered |= {(name, g.index): g.free_mib for g in state.gpus}
    assert {(r.node, r.index): r.free_mib for r in rows} == offered
    assert offered[("node-a", 0)] == 23034 - 1024
