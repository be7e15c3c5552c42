"""``infergrid simulate`` from the command line: the table, the JSON schema, the PNG, errors."""

import json

import pytest

from infergrid.cli import main
from infergrid.simulate.cli import parse_checkpoints, parse_seeds
from infergrid.simulate.report import SCHEMA

from .tracefiles import nodes_csv, pods_csv


@pytest.fixture
def trace(tmp_path):
    nodes = nodes_csv(tmp_path, "n0,32000,131072,2,T4", "n1,96000,393216,4,G2")
    pods = pods_csv(
        tmp_path,
        "p0,8000,16384,1,1000,",
        "p1,4000,8192,1,470,",
        "p2,12000,16384,0,0,",
        "p3,4000,8192,1,810,T4",
        "p4,16000,32768,2,1000,G2",
    )
    return str(nodes), str(pods)


def simulate(capsys, trace, *flags):
    nodes, pods = trace
    status = main(["simulate", "--nodes", nodes, "--pods", pods, "--quiet", *flags])
    out, err = capsys.readouterr()
    return status, out, err


def test_the_table_has_a_row_per_policy(capsys, trace):
    status, out, _ = simulate(
        capsys, trace, "--policies", "fgd-cluster-aware,best-fit", "--seeds", "1-2"
    )
    assert status == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "POLICY", "@90%", "@95%", "@100%", "@110%", "@130%", "MEAN@100%", "FRAG@100%",
        "FAILED", "S/RUN",
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[1:3]] == ["fgd-cluster-aware", "best-fit"]


def test_the_trace_workload_switch_runs_the_production_policies_unlearned(capsys, trace):
    flags = ("--policies", "fgd,binpack", "--seeds", "1", "--json")
    runs = {}
    for workload in ("learned", "trace"):
        status, out, _ = simulate(capsys, trace, *flags, "--workload", workload)
        assert status == 0
        runs[workload] = {p["name"]: p["checkpoints"] for p in json.loads(out)["policies"]}
    # binpack reads no workload: the switch changes nothing there.
    assert runs["learned"]["binpack"] == runs["trace"]["binpack"]


def test_json_follows_the_documented_schema(capsys, trace):
    status, out, _ = simulate(
        capsys, trace, "--policies", "random-fit,fgd-paper", "--seeds", "3,5", "--json"
    )
    assert status == 0
    doc = json.loads(out)
    assert doc["schema"] == SCHEMA
    assert doc["trace"]["node_count"] == 2 and doc["trace"]["gpus"] == 6
    assert doc["protocol"] == {
        "seeds": [3, 5],
        "inflation": 1.3,
        "checkpoints_pct": [90, 95, 100, 110, 130],
    }
    random_fit, fgd_paper = doc["policies"]
    assert (random_fit["name"], random_fit["paper"]) == ("random-fit", "01-Random")
    assert fgd_paper["paper"] == "06-FGD"
    point = random_fit["checkpoints"][2]
    assert point["arrived_pct"] == 100
    assert set(point) == {
        "arrived_pct",
        "unallocated_gpu_pct",
        "fragmentation_rate_pct",
        "failed_pods",
    }
    assert set(point["unallocated_gpu_pct"]) == {"mean", "median", "sd"}
    assert [run["seed"] for run in random_fit["runs"]] == [3, 5]
    assert set(random_fit["runs"][0]) == {"seed", "pods", "failed_pods", "seconds", "checkpoints"}
    assert random_fit["curve"][0]["arrived_pct"] >= 0
    assert set(random_fit["curve"][0]) == {"arrived_pct", "unallocated_gpu_pct_median"}


def test_worker_processes_give_the_same_report(capsys, trace):
    flags = ("--policies", "best-fit,random-fit", "--seeds", "1-2", "--json")
    _, one, _ = simulate(capsys, trace, *flags)
    _, two, _ = simulate(capsys, trace, *flags, "--jobs", "2")
    strip = lambda text: [  # noqa: E731
        {k: v for k, v in p.items() if k != "runs"} for p in json.loads(text)["policies"]
    ]
    assert strip(one) == strip(two)


def test_the_png_is_drawn(capsys, trace, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "curve.png"
    status, _, _ = simulate(
        capsys, trace, "--policies", "best-fit", "--seeds", "1", "--png", str(path)
    )
    assert status == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ("--policies", "tetris"),
            "error: policies: 'tetris' is not one of fgd-cluster-aware, fgd,",
        ),
        (("--seeds", "9-3"), "error: seeds: '9-3': the range runs backwards"),
        (("--seeds", "x"), "error: seeds: 'x' is not a seed or a range like 42-51"),
        (("--at", "140"), "error: at: 140 is not from 0 to 130"),
        (("--jobs", "0"), "error: jobs: must be from 1 to 64, got 0"),
        (("--inflation", "0"), "error: inflation: must be above 0, got 0.0"),
    ],
)
def test_bad_flags_fail_with_the_field_named(capsys, trace, flags, message):
    status, out, err = simulate(capsys, trace, *flags)
    assert (status, out) == (2, "")
    assert err.startswith(message)


def test_a_bad_trace_fails_with_file_line_and_column(capsys, tmp_path):
    nodes = nodes_csv(tmp_path, "n0,32000,131072,2,T4")
    pods = pods_csv(tmp_path, "p0,8000,16384,1,1000,", "p1,lots,1,1,500,")
    status = main(["simulate", "--nodes", str(nodes), "--pods", str(pods), "--seeds", "1"])
    _, err = capsys.readouterr()
    assert status == 2
    assert err == f"error: {pods}:3: cpu_milli: 'lots' is not a whole number\n"


def test_seeds_and_checkpoints_parse_ranges_and_lists():
    assert parse_seeds("42-45,50,43") == (42, 43, 44, 45, 50)
    assert parse_checkpoints("100, 90,100") == (100, 90)
