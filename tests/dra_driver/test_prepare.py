"""What a prepared claim gives its container, its CDI spec, and the files that keep it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dra_driver import cdi
from dra_driver.checkpoint import Checkpoint, GrantedDevice, PreparedClaim
from dra_driver.prepare import ClaimRef, PrepareError, prepare_claim
from dra_driver.slices import node_devices
from infergrid.share_edits import share_edits
from tests.dra_driver.conftest import MIG_3_2_2, NODE, gpu, mig_gpu

UID = "0b0c6f5e-8a6b-4c7e-9d3a-1f2e3d4c5b6a"
REF = ClaimRef("team-a", UID, "llm-gpu")
DEVICES = node_devices([gpu(0), gpu(1), mig_gpu(2, MIG_3_2_2)])
MPS = Path("/run/infergrid/mps")


def result(device: str, request: str = "gpu", **extra) -> dict:
    base = {"request": request, "driver": "gpu.infergrid.io", "pool": NODE, "device": device}
    return base | extra


def claim(*results: dict, uid: str = UID) -> dict:
    return {
        "metadata": {"name": "llm-gpu", "namespace": "team-a", "uid": uid},
        "status": {"allocation": {"devices": {"results": list(results)}}},
    }


def test_a_whole_gpu_shows_its_uuid_and_budgets_all_its_memory():
    [device] = prepare_claim(REF, claim(result("gpu-1")), NODE, DEVICES, MPS)
    assert device.envs == {
        "NVIDIA_VISIBLE_DEVICES": gpu(1).uuid,
        "INFERGRID_GPU_MEMORY_MIB": "81920",
    }
    assert device.mounts == ()
    assert (device.request_names, device.pool, device.device) == (("gpu",), NODE, "gpu-1")
    assert (device.cdi_name, device.share_id) == (f"{UID}-0", None)


def test_a_share_is_budgeted_its_consumed_memory():
    share = result("gpu-0", shareID="s-1", consumedCapacity={"memory": "4Gi", "cores": "0"})
    [device] = prepare_claim(REF, claim(share), NODE, DEVICES, None)
    assert device.envs == {
        "NVIDIA_VISIBLE_DEVICES": gpu(0).uuid,
        "INFERGRID_GPU_MEMORY_MIB": "4096",
    }
    assert device.share_id == "s-1"


def test_a_share_on_an_mps_node_gets_the_device_plugins_mps_edits():
    share = result("gpu-0", shareID="s-1", consumedCapacity={"memory": "8Gi", "cores": "30"})
    [device] = prepare_claim(REF, claim(share), NODE, DEVICES, MPS)
    envs, mounts = share_edits(8192, MPS, gpu(0).uuid, 30)
    assert device.envs == {"NVIDIA_VISIBLE_DEVICES": gpu(0).uuid, **envs}
    assert device.mounts == mounts


def test_a_share_without_cores_on_mps_runs_on_its_memorys_part_of_the_sms():
    share = result("gpu-0", shareID="s-1", consumedCapacity={"memory": "20481Mi"})
    [device] = prepare_claim(REF, claim(share), NODE, DEVICES, MPS)
    assert device.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "26"  # ceil(100 * 20481 / 81920)


def test_a_share_of_all_the_memory_holds_the_gpu_whole_without_mps():
    whole = result("gpu-0", shareID="s-1", consumedCapacity={"memory": "81920Mi"})
    [device] = prepare_claim(REF, claim(whole), NODE, DEVICES, MPS)
    assert device.envs["INFERGRID_GPU_MEMORY_MIB"] == "81920"
    assert "CUDA_MPS_PIPE_DIRECTORY" not in device.envs and device.mounts == ()


def test_a_mig_instance_shows_its_own_uuid_and_memory_never_mps():
    [device] = prepare_claim(REF, claim(result("mig-2-0")), NODE, DEVICES, MPS)
    assert device.envs == {
        "NVIDIA_VISIBLE_DEVICES": "MIG-2-0",
        "INFERGRID_GPU_MEMORY_MIB": "40192",
    }


def test_devices_of_one_request_are_all_visible_and_requests_stay_apart():
    both = claim(
        result("gpu-0", "train"), result("gpu-1", "train"), result("mig-2-1", "probe/small")
    )
    first, second, third = prepare_claim(REF, both, NODE, DEVICES, None)
    assert first.envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpu(0).uuid},{gpu(1).uuid}"
    assert second.envs["NVIDIA_VISIBLE_DEVICES"] == f"{gpu(0).uuid},{gpu(1).uuid}"
    assert third.envs["NVIDIA_VISIBLE_DEVICES"] == "MIG-2-1"
    assert third.request_names == ("probe", "probe/small")
    assert [d.cdi_name for d in (first, second, third)] == [f"{UID}-{n}" for n in range(3)]


def test_results_of_other_drivers_and_pools_are_not_ours():
    mixed = claim(
        result("gpu-0", driver="gpu.nvidia.com"),
        result("gpu-1", pool="node-b"),
        result("gpu-1"),
    )
    assert [d.device for d in prepare_claim(REF, mixed, NODE, DEVICES, None)] == ["gpu-1"]


def test_an_unknown_device_fails_the_claim_naming_it():
    with pytest.raises(PrepareError, match="device 'gpu-7' is not a device of this node"):
        prepare_claim(REF, claim(result("gpu-0"), result("gpu-7")), NODE, DEVICES, None)


def test_a_uid_mismatch_is_another_claim_of_the_same_name():
    with pytest.raises(PrepareError, match="uid 'other-uid', a different claim"):
        prepare_claim(REF, claim(result("gpu-0"), uid="other-uid"), NODE, DEVICES, None)


@pytest.mark.parametrize(
    "bad, words",
    [
        ({"metadata": {"uid": UID}}, "is not allocated"),
        ({"metadata": {"uid": UID}, "status": {"allocation": {}}}, "is not allocated"),
        (claim() | {"status": {"allocation": {"devices": {"results": "x"}}}}, "not a list"),
        (claim(result("gpu-0", consumedCapacity={"memory": "lots"})), "consumedCapacity.memory"),
        (claim(result("gpu-0", consumedCapacity={"memory": "1Ki"})), "less than 1Mi"),
    ],
)
def test_a_malformed_claim_is_an_error_not_a_crash(bad, words):
    with pytest.raises(PrepareError, match=words):
        prepare_claim(REF, bad, NODE, DEVICES, None)


def test_an_error_repeats_a_hostile_name_escaped_and_cut():
    ref = ClaimRef("ns", UID, "\ud800" + "x" * 10_000)
    with pytest.raises(PrepareError) as caught:
        prepare_claim(ref, claim(result("gpu-9")), NODE, DEVICES, None)
    message = str(caught.value)
    assert "\\ud800" in message and len(message) < 400
    message.encode("utf-8")  # no lone surrogate left


def test_the_cdi_spec_names_each_device_and_carries_its_edits():
    share = result("gpu-0", shareID="s-1", consumedCapacity={"memory": "8Gi", "cores": "30"})
    prepared = prepare_claim(REF, claim(share, result("gpu-1", "b")), NODE, DEVICES, MPS)
    spec = cdi.claim_spec(prepared)
    assert spec["cdiVersion"] == "0.6.0" and spec["kind"] == "infergrid.io/gpu"
    first, second = spec["devices"]
    assert first["name"] == f"{UID}-0"
    assert first["containerEdits"]["env"] == sorted(f"{k}={v}" for k, v in prepared[0].envs.items())
    pipe = str(MPS / gpu(0).uuid / "pipe")
    assert {"hostPath": pipe, "containerPath": pipe, "type": "bind",
            "options": ["rbind", "rw"]} in first["containerEdits"]["mounts"]  # fmt: skip
    assert second["containerEdits"] == {
        "env": ["INFERGRID_GPU_MEMORY_MIB=81920", f"NVIDIA_VISIBLE_DEVICES={gpu(1).uuid}"],
        "mounts": [],
    }
    assert cdi.cdi_id(first["name"]) == f"infergrid.io/gpu={UID}-0"


def test_a_spec_file_is_written_whole_and_removed(tmp_path):
    prepared = prepare_claim(REF, claim(result("gpu-0")), NODE, DEVICES, None)
    path = cdi.write_spec(tmp_path, UID, prepared)
    assert path == tmp_path / f"infergrid.io-gpu_{UID}.json"
    assert json.loads(path.read_text()) == cdi.claim_spec(prepared)
    assert os.listdir(tmp_path) == [path.name]  # no temporary file left beside it
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    cdi.remove_spec(tmp_path, UID)
    cdi.remove_spec(tmp_path, UID)  # gone already: still fine
    assert os.listdir(tmp_path) == []


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "spec.json"
    cdi.write_atomically(path, "old")

    def broken(*_):
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", broken)
    with pytest.raises(OSError):
        cdi.write_atomically(path, "new")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["spec.json"]


def test_the_checkpoint_survives_a_restart_and_forgets_on_drop(tmp_path):
    granted = PreparedClaim(
        "ns", "c", (GrantedDevice(("gpu",), NODE, "gpu-0", ("infergrid.io/gpu=u-0",), "s-1"),)
    )
    Checkpoint(tmp_path).put("u", granted)
    again = Checkpoint(tmp_path)
    assert again.get("u") == granted and again.uids() == ["u"]
    again.drop("u")
    assert Checkpoint(tmp_path).get("u") is None


def test_an_unreadable_checkpoint_starts_empty(tmp_path, caplog):
    (tmp_path / "checkpoint.json").write_text("{not json")
    assert Checkpoint(tmp_path).uids() == []
    assert "unreadable" in caplog.text
