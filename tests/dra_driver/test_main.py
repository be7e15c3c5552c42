"""The wired driver on a fleet file's fake GPUs: it publishes, serves, prepares, and on stop
removes its sockets; it refuses to start on a node in device-plugin mode."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import grpc

from dra_driver import main as driver_main
from dra_driver.config import DriverConfig
from dra_driver.kubelet.dra.v1 import api_pb2, api_pb2_grpc
from dra_driver.main import Driver, make_backend
from tests.device_plugin.conftest import SAMPLE
from tests.dra_driver.test_prepare import UID, claim
from tests.dra_driver.test_publisher import FakeSliceApi

OWNER = {"apiVersion": "v1", "kind": "Node", "name": "a100-1", "uid": "u-1"}


class FakeApi(FakeSliceApi):
    def __init__(self) -> None:
        super().__init__()
        self.claims: dict[tuple[str, str], dict] = {}
        self.node = {"metadata": {"name": "a100-1", "uid": "u-1"}}

    def read_claim(self, namespace: str, name: str) -> dict | None:
        return self.claims.get((namespace, name))

    def read_node(self, name: str) -> dict:
        return self.node


def test_the_driver_publishes_serves_prepares_and_stops_clean():
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    cfg = DriverConfig("a100-1", SAMPLE, root / "p", root / "r", root / "cdi")
    api = FakeApi()
    mig = {"request": "r", "driver": "gpu.infergrid.io", "pool": "a100-1", "device": "mig-0-1"}
    api.claims[("ns", "c")] = claim(mig)
    driver = Driver(cfg, make_backend(cfg), api, OWNER)
    driver.start()
    try:
        channel = grpc.insecure_channel(f"unix://{root / 'p' / 'dra.sock'}")
        request = api_pb2.NodePrepareResourcesRequest(
            claims=[api_pb2.Claim(namespace="ns", uid=UID, name="c")]
        )
        answer = api_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(request, timeout=5)
        channel.close()
        assert answer.claims[UID].error == ""
        spec = json.loads((root / "cdi" / f"infergrid.io-gpu_{UID}.json").read_text())
        env = spec["devices"][0]["containerEdits"]["env"]
        assert any(e.startswith("NVIDIA_VISIBLE_DEVICES=MIG-") for e in env)
    finally:
        driver.stop()
    names = {d["name"] for s in api.slices.values() for d in s["spec"].get("devices", [])}
    assert names == {"mig-0-0", "mig-0-1", *(f"gpu-{i}" for i in range(1, 8))}
    assert list((root / "r").iterdir()) == [] and not (root / "p" / "dra.sock").exists()
    shutil.rmtree(root)


def test_main_refuses_a_device_plugin_node(monkeypatch, tmp_path, capsys):
    api = FakeApi()
    api.node["metadata"]["annotations"] = {"infergrid.io/gpu-inventory": "{}"}
    monkeypatch.setattr(driver_main, "api_client", lambda kubeconfig: None)
    monkeypatch.setattr(driver_main, "KubeApi", lambda client: api)
    argv = ["--node", "a100-1", "--fake-fleet", str(SAMPLE), "--plugin-dir", str(tmp_path)]
    assert driver_main.main(argv) == 2
    assert "device-plugin mode" in capsys.readouterr().err
