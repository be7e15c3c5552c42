"""The infergrid command: exit 0 with output, or exit 2 with one error line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infergrid import __version__
from infergrid.cli import main

SAMPLE = str(Path(__file__).parent.parent / "e2e" / "fleets" / "sample.yaml")


def test_fleet_prints_a_table_of_nodes_and_capacity(capsys):
    assert main(["fleet", SAMPLE]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["NODE", "MODEL", "GPUS", "MEMORY_MIB", "CAPACITY"]
    assert [r.split()[0] for r in rows] == [
        "a100-0",
        "a100-1",
        "l4-0",
        "l4-1",
        "h100",
        "local-a100",
    ]
    assert "nvidia.com/gpu=7,infergrid.io/vgpu=70,nvidia.com/mig-3g.40gb=2" in rows[1]


def test_pod_request_prints_each_container_as_json(tmp_path, capsys):
    pod = {
        "metadata": {"name": "p", "annotations": {"infergrid.io/placement-policy": "spread"}},
        "spec": {
            "containers": [
                {
                    "name": "engine",
                    "resources": {
                        "limits": {"infergrid.io/vgpu": 1, "infergrid.io/gpu-memory": 4096}
                    },
                }
            ]
        },
    }
    path = tmp_path / "pod.yaml"
    path.write_text(yaml.safe_dump(pod))
    assert main(["pod-request", str(path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == {
        "policy": "spread",
        "topology": None,
        "containers": [
            {
                "name": "engine",
                "init": False,
                "kind": "share",
                "gpus": 1,
                "memoryMiB": 4096,
                "cores": 0,
                "migProfile": None,
            }
        ],
    }


def test_version(capsys):
    assert main(["version"]) == 0
    assert capsys.readouterr().out.strip() == __version__


@pytest.mark.parametrize(
    ("command", "content", "says"),
    [
        ("fleet", "version: v1\nnodes: []\n", "error: nodes: a fleet needs at least one node"),
        ("fleet", "version: [\n", "not valid YAML"),
        (
            "pod-request",
            "spec:\n  containers:\n  - name: c\n    resources:\n      limits:\n"
            "        infergrid.io/vgpu: 2\n",
            "error: spec.containers[0].resources.limits[infergrid.io/vgpu]",
        ),
        ("pod-request", "- not a pod\n", "error: pod: expected object, got list"),
    ],
)
def test_bad_input_exits_2_with_one_error_line(tmp_path, capsys, command, content, says):
    path = tmp_path / "input.yaml"
    path.write_text(content)
    assert main([command, str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("error: ")
    assert says in captured.err
    assert len(captured.err.splitlines()) == 1
    assert "Traceback" not in captured.err


def test_a_missing_file_exits_2(tmp_path, capsys):
    assert main(["fleet", str(tmp_path / "nope.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as raised:
        main([])
    assert raised.value.code == 2


def test_output_into_a_pipe_the_reader_closed_ends_quietly():
    """`infergrid fleet ... | head -0`: the reader went away before the table came; that is
    no error, and no traceback."""
    read, write = os.pipe()
    os.close(read)
    done = subprocess.run(
        [sys.executable, "-c", "from infergrid.cli import main; raise SystemExit(main())",
         "fleet", SAMPLE],
        stdout=write, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    os.close(write)
    assert (done.returncode, done.stderr) == (0, "")
