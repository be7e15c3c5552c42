"""Reading node and pod CSVs: what is kept, and errors that name the file, line and column."""

import pytest

from infergrid.errors import ContractError
from infergrid.simulate.trace import TraceNode, TracePod, load_nodes, load_pods

from .tracefiles import NODE_HEADER, POD_HEADER, nodes_csv, pods_csv, write


def test_nodes_are_read_with_their_gpus_and_model(tmp_path):
    path = nodes_csv(tmp_path, "n0,64000,262144,2,P100", "n1,8000,32768,0,")
    assert load_nodes(path) == (
        TraceNode("n0", 64000, 262144, 2, "P100"),
        TraceNode("n1", 8000, 32768, 0, ""),
    )


def test_pods_keep_gpu_spec_and_ignore_extra_columns(tmp_path):
    path = write(
        tmp_path / "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase",
        [
            "p0,12000,16384,1,1000,,LS,Running",
            "p1,6000,12288,1,460,V100M16|V100M32|V100M32,BE,Failed",
            "p2,8000,4096,0,0,,BE,Pending",
            "p3,88000,100000,8,1000,,LS,Running",
        ],
    )
    pods = load_pods(path)
    assert pods[1] == TracePod("p1", 6000, 12288, 1, 460, frozenset({"V100M16", "V100M32"}))
    assert [p.gpu_request_milli for p in pods] == [1000, 460, 0, 8000]


def test_the_gpu_spec_column_is_optional(tmp_path):
    path = write(
        tmp_path / "multigpu.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli", ["p,1,1,2,1000"]
    )
    assert load_pods(path) == (TracePod("p", 1, 1, 2, 1000),)


@pytest.mark.parametrize(
    ("row", "where", "reason"),
    [
        ("p1,abc,1,1,500,", ":3: cpu_milli", "'abc' is not a whole number"),
        ("p1,1,-5,1,500,", ":3: memory_mib", "-5 is out of range: must be at least 0"),
        ("p1,1,1,1,1500,", ":3: gpu_milli", "1500 is out of range: must be from 0 to 1000"),
        ("p1,1,1,2,500,", ":3: num_gpu", "is 2, but a share (500 milli) is of one GPU"),
        ("p1,1,1,1,0,", ":3: gpu_milli", "is 0, but the pod asks for 1 GPU(s)"),
        ("p1,1,1,0,300,", ":3: num_gpu", "is 0, but gpu_milli is 300"),
        ("p1,1,1,,500,", ":3: num_gpu", "is empty"),
        ("p0,1,1,1,500,", ":3: name", "'p0' is also on line 2"),
        ("p1,1,1,1", ":3", "4 fields, the header has 6"),
    ],
)
def test_a_bad_pod_row_names_file_line_and_column(tmp_path, row, where, reason):
    path = pods_csv(tmp_path, "p0,1,1,1,500,", row)
    with pytest.raises(ContractError) as caught:
        load_pods(path)
    assert caught.value.field == f"{path}{where}"
    assert caught.value.reason == reason


@pytest.mark.parametrize(
    ("row", "where", "reason"),
    [
        ("n1,1,1,2,", ":3: model", "is empty"),
        ("n1,1,1,x,T4", ":3: gpu", "'x' is not a whole number"),
        ("n0,1,1,1,T4", ":3: sn", "'n0' is also on line 2"),
    ],
)
def test_a_bad_node_row_names_file_line_and_column(tmp_path, row, where, reason):
    path = nodes_csv(tmp_path, "n0,1,1,1,T4", row)
    with pytest.raises(ContractError) as caught:
        load_nodes(path)
    assert caught.value.field == f"{path}{where}"
    assert caught.value.reason == reason


def test_a_missing_column_is_named_with_the_header(tmp_path):
    path = write(tmp_path / "pods.csv", "name,cpu_milli,num_gpu,gpu_milli", ["p,1,1,500"])
    with pytest.raises(ContractError, match=r"pods.csv:1: memory_mib: missing column; the header"):
        load_pods(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("", "empty file: no header"),
        (POD_HEADER + "\n", "no pods"),
    ],
)
def test_empty_pod_files_are_refused(tmp_path, content, message):
    path = tmp_path / "pods.csv"
    path.write_text(content)
    with pytest.raises(ContractError, match=message):
        load_pods(path)


def test_an_unreadable_file_is_a_contract_error(tmp_path):
    with pytest.raises(ContractError, match="missing.csv: cannot read"):
        load_nodes(tmp_path / "missing.csv")
    with pytest.raises(ContractError, match="no nodes"):
        load_nodes(write(tmp_path / "n.csv", NODE_HEADER, []))
