"""`make demo`, shortened (fewer services, shorter answers), as CI runs it.

It starts its own cluster, real node included, in a state folder of its own. One real node
runs per machine, so `make e2e` runs this module after the rest of the suite has stopped
its cluster; beside a cluster that `make cluster-up` left running it cannot start.
"""

from __future__ import annotations

import json

import pytest
from kubernetes import client

from e2e.cluster.real_node import RUN_ROOT
from e2e.demo import NAMESPACE, Demo
from infergrid.constants import PLACEMENT_POLICIES

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The demo's steps with --keep, so the test can compare with the API server after."""
    if RUN_ROOT.exists() and any(RUN_ROOT.iterdir()):
        pytest.skip(f"another local cluster's real node runs ({RUN_ROOT}); make cluster-down")
    lines: list[str] = []
    demo = Demo(keep=True, quick=True, state=tmp_path_factory.mktemp("demo"), out=lines.append)
    try:
        code = demo.run()
        yield demo, code, "\n".join(lines)
    finally:
        demo.down()


def test_the_demo_runs_every_step_and_says_so(demo_run):
    demo, code, output = demo_run
    assert code == 0, output
    for step in range(1, 12):
        assert f"[{step}/11]" in output
    assert "smollm2> " in output and output.split("smollm2> ", 1)[1].strip()
    # The chart's pods, each Ready under its own ServiceAccount on the real node.
    rows = _release_rows(output)
    for component in ("operator", "scheduler", "gateway", "device-plugin"):
        ((node, account),) = [v for k, v in rows.items() if k.startswith(f"infergrid-{component}-")]
        assert node == "local-l4" and account.startswith("infergrid-"), (component, account)
    # The chat went through the chart's gateway, which counted it.
    assert "the chart's gateway, pod infergrid-system/infergrid-gateway-" in output
    assert "GET /v1/models -> smollm2" in output
    assert "through the gateway      smollm2 200: 1" in output
    # Served from a pod on the real node, not a process beside the cluster.
    assert "Ready on local-l4" in output and "serving smollm2 (text-generation)" in output
    assert "time to first token" in output and "time per output token" in output
    assert "queue depth" in output


def test_what_if_replays_every_gpu_pod_of_the_demo_under_each_policy(demo_run):
    """The what-if table of the demo's own cluster: one row per policy of the extender's,
    each placing the sample pods that hold GPUs now, and a re-pack that moved nothing."""
    demo, code, output = demo_run
    assert code == 0, output
    table = output.split("infergrid what-if", 1)[1].split("done in", 1)[0]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:] if line.strip()}
    holding = rows["now"][1]
    assert int(holding) >= 1
    for policy in PLACEMENT_POLICIES:
        assert rows[policy][1] == holding, table  # placed: every pod that holds GPUs now
    assert "a plan only, nothing was moved" in table


def test_the_demo_ends_with_the_report_of_its_own_run(demo_run):
    """Read from the cluster's Prometheus over the run: the sample pods on GPU shares held
    less than the whole GPUs they would have held, the total says so, and the page is there
    with the same figure."""
    demo, code, output = demo_run
    assert code == 0, output
    report = output.split("infergrid report of this run", 1)[1]
    (total,) = [line for line in report.splitlines() if line.split()[:2] == ["all", "all"]]
    held, whole = float(total.split()[4]), float(total.split()[5])
    assert 0 < held < whole, report
    assert "sharing held" in report and "whole GPUs would have held" in report
    page = demo.state / "report.html"
    assert f"the page, with its plots: {page}" in report
    assert 'id="total-held-gpu-hours"' in page.read_text()


def test_the_placement_table_matches_the_assignments_the_api_server_holds(demo_run):
    demo, code, output = demo_run
    assert code == 0, output
    core = client.CoreV1Api(demo.cluster.api())
    table = _table(output)
    held: dict[tuple[str, str], set[str]] = {}
    assigned: dict[tuple[str, str], int] = {}
    for pod in core.list_namespaced_pod(NAMESPACE).items:
        raw = (pod.metadata.annotations or {}).get("infergrid.io/gpu-assignment")
        assert raw, f"{pod.metadata.name} has no assignment"
        doc = json.loads(raw)
        assert doc["node"] == pod.spec.node_name
        for container in doc["containers"]:
            for gpu in container.get("gpus", []):
                key = (doc["node"], gpu["uuid"])
                held.setdefault(key, set()).add(pod.metadata.name)
                assigned[key] = assigned.get(key, 0) + gpu["memoryMiB"]
    index = _gpu_indices(core)
    for (node, uuid), pods in held.items():
        shown = table[(node, index[uuid])]
        assert {p.split("/", 1)[1] for p in shown["pods"]} >= pods
        assert 0 <= shown["free"] <= shown["total"] - assigned[(node, uuid)]
    total_holders = sum(len(row["pods"]) for row in table.values())
    assert total_holders >= sum(len(p) for p in held.values()) > 0


def test_no_component_runs_beside_the_cluster_only_the_kwok_fleets_plugins(demo_run):
    demo, code, output = demo_run
    assert code == 0, output
    processes = demo.cluster.processes.names()
    for name in ("extender", "operator", "gateway", "infergrid-scheduler"):
        assert name not in processes
    plugins = [n for n in processes if n.startswith("device-plugin-")]
    assert plugins and "device-plugin-local-l4" not in plugins


def test_keep_leaves_the_engine_and_cluster_reachable_until_down(demo_run):
    demo, code, output = demo_run
    assert "make demo-down" in output
    assert demo.cluster.is_running()


def _release_rows(output: str) -> dict[str, tuple[str, str]]:
    """The release's pods as the demo printed them: pod name -> (node, ServiceAccount)."""
    lines = output.split("POD ", 1)[1].split("done in", 1)[0].splitlines()[1:]
    return {cells[0]: (cells[2], cells[3]) for line in lines if len(cells := line.split()) == 4}


def _gpu_indices(core: client.CoreV1Api) -> dict[str, str]:
    found = {}
    for node in core.list_node().items:
        raw = (node.metadata.annotations or {}).get("infergrid.io/gpu-inventory")
        for gpu in json.loads(raw)["gpus"] if raw else []:
            found[gpu["uuid"]] = str(gpu["index"])
    return found


def _table(output: str) -> dict[tuple[str, str], dict]:
    """The printed table: per (node, GPU index) its holders (namespace/pod)."""
    step = output.split("placement per GPU", 1)[1]
    lines = step.split("NODE ", 1)[1].split("done in", 1)[0].splitlines()[1:]
    rows: dict[tuple[str, str], dict] = {}
    current = None
    for line in lines:
        cells = line.split()
        if not cells:
            continue
        if "/" in cells[0]:  # a further holder of the GPU above
            rows[current]["pods"].append(cells[0])
            continue
        current = (cells[0], cells[1])
        pod = next((c for c in cells if "/" in c), None)
        free, total = [int(c) for c in cells[2:] if c.isdigit()][-2:]
        rows[current] = {"pods": [pod] if pod else [], "free": free, "total": total}
    return rows
