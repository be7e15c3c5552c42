"""The driver as the kubelet meets it: real gRPC on unix sockets, the API server faked at its edge.

Each test plays the kubelet's plugin watcher: it finds the registration socket, asks GetInfo,
reports the outcome, then prepares and unprepares claims on the endpoint GetInfo named.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from dra_driver.checkpoint import Checkpoint
from dra_driver.claims import ApiError, ClaimPreparer
from dra_driver.kubelet.dra.v1 import api_pb2, api_pb2_grpc
from dra_driver.kubelet.pluginregistration.v1 import api_pb2 as reg_pb2
from dra_driver.kubelet.pluginregistration.v1 import api_pb2_grpc as reg_grpc
from dra_driver.plugin import KubeletPlugin
from dra_driver.slices import node_devices
from tests.dra_driver.conftest import NODE, gpu
from tests.dra_driver.test_prepare import UID, claim, result

OTHER = "5d4c3b2a-1f0e-4d9c-8b7a-6f5e4d3c2b1a"


class FakeApi:
    """The API edge only: ResourceClaims by (namespace, name) as the API server serves them."""

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], dict] = {}
        self.failing = False
        self.reads = 0

    def read_claim(self, namespace: str, name: str) -> dict | None:
        self.reads += 1
        if self.failing:
            raise ApiError(f"get resourceclaim {namespace}/{name}: 503 Service Unavailable")
        return self.claims.get((namespace, name))


class Kubelet:
    """The kubelet's side of both sockets."""

    def __init__(self, root: Path, api: FakeApi) -> None:
        self.root, self.api = root, api
        self.plugin = self._plugin()
        self.plugin.start()
        self.channels: list[grpc.Channel] = []

    def _plugin(self) -> KubeletPlugin:
        preparer = ClaimPreparer(
            NODE,
            self.api.read_claim,
            lambda: node_devices([gpu(0), gpu(1)]),
            self.root / "cdi",
            Checkpoint(self.root / "plugin"),
            None,
        )
        return KubeletPlugin(preparer, self.root / "plugin", self.root / "registry")

    def restart(self) -> None:
        self.plugin.stop()
        self.plugin = self._plugin()
        self.plugin.start()

    def channel(self, socket: str | Path) -> grpc.Channel:
        channel = grpc.insecure_channel(f"unix://{socket}")
        self.channels.append(channel)
        return channel

    def register(self) -> reg_pb2.PluginInfo:
        [socket] = (self.root / "registry").iterdir()
        stub = reg_grpc.RegistrationStub(self.channel(socket))
        info = stub.GetInfo(reg_pb2.InfoRequest(), timeout=5)
        stub.NotifyRegistrationStatus(reg_pb2.RegistrationStatus(plugin_registered=True), timeout=5)
        return info

    def dra(self) -> api_pb2_grpc.DRAPluginStub:
        return api_pb2_grpc.DRAPluginStub(self.channel(self.register().endpoint))

    def prepare(self, *claims: tuple[str, str, str]) -> api_pb2.NodePrepareResourcesResponse:
        request = api_pb2.NodePrepareResourcesRequest(
            claims=[api_pb2.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
        )
        return self.dra().NodePrepareResources(request, timeout=5)

    def unprepare(self, *uids: str) -> api_pb2.NodeUnprepareResourcesResponse:
        request = api_pb2.NodeUnprepareResourcesRequest(
            claims=[api_pb2.Claim(namespace="team-a", uid=u, name="x") for u in uids]
        )
        return self.dra().NodeUnprepareResources(request, timeout=5)

    def close(self) -> None:
        for channel in self.channels:
            channel.close()
        self.plugin.stop()


@pytest.fixture
def kubelet() -> Iterator[Kubelet]:
    """Sockets under a short folder of /tmp: a unix socket's path holds 107 bytes at most."""
    root = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    api = FakeApi()
    api.claims[("team-a", "llm-gpu")] = claim(result("gpu-1"))
    k = Kubelet(root, api)
    yield k
    k.close()
    shutil.rmtree(root)


CLAIM = ("team-a", UID, "llm-gpu")


def test_registration_names_the_dra_v1_service_and_the_endpoint(kubelet):
    info = kubelet.register()
    assert (info.type, info.name) == ("DRAPlugin", "gpu.infergrid.io")
    assert info.endpoint == str(kubelet.root / "plugin" / "dra.sock")
    assert list(info.supported_versions) == ["v1.DRAPlugin"]
    assert (kubelet.root / "registry" / "gpu.infergrid.io-reg.sock").is_socket()
    assert kubelet.plugin.registration.registered.is_set()


def test_a_refused_registration_is_logged_loudly(kubelet, caplog):
    [socket] = (kubelet.root / "registry").iterdir()
    stub = reg_grpc.RegistrationStub(kubelet.channel(socket))
    status = reg_pb2.RegistrationStatus(plugin_registered=False, error="version unsupported")
    stub.NotifyRegistrationStatus(status, timeout=5)
    assert "THE KUBELET REFUSED" in caplog.text and "version unsupported" in caplog.text
    assert not kubelet.plugin.registration.registered.is_set()


def test_prepare_writes_the_cdi_spec_and_answers_the_devices(kubelet):
    answer = kubelet.prepare(CLAIM).claims[UID]
    assert answer.error == ""
    [device] = answer.devices
    assert list(device.request_names) == ["gpu"]
    assert (device.pool_name, device.device_name) == (NODE, "gpu-1")
    assert list(device.cdi_device_ids) == [f"infergrid.io/gpu={UID}-0"]
    assert not device.HasField("share_id")
    assert (kubelet.root / "cdi" / f"infergrid.io-gpu_{UID}.json").exists()


def test_a_share_answers_its_share_id(kubelet):
    share = result("gpu-0", shareID="share-9", consumedCapacity={"memory": "4Gi"})
    kubelet.api.claims[("team-a", "llm-gpu")] = claim(share)
    [device] = kubelet.prepare(CLAIM).claims[UID].devices
    assert device.share_id == "share-9"


def test_prepare_again_answers_the_same_without_asking_the_api(kubelet):
    first = kubelet.prepare(CLAIM)
    reads = kubelet.api.reads
    kubelet.api.claims.clear()
    assert kubelet.prepare(CLAIM) == first
    assert kubelet.api.reads == reads


def test_unprepare_removes_the_spec_and_a_restarted_driver_still_does(kubelet):
    kubelet.prepare(CLAIM)
    kubelet.restart()
    assert kubelet.unprepare(UID).claims[UID].error == ""
    assert list((kubelet.root / "cdi").iterdir()) == []
    assert Checkpoint(kubelet.root / "plugin").uids() == []


def test_unpreparing_an_unknown_claim_succeeds(kubelet):
    answer = kubelet.unprepare(OTHER, "../../etc/passwd", "")
    assert [answer.claims[u].error for u in (OTHER, "../../etc/passwd", "")] == ["", "", ""]


def test_each_claim_fails_alone_with_an_error_naming_what_was_wrong(kubelet):
    kubelet.api.claims[("team-a", "wrong-device")] = claim(result("gpu-5"), uid=OTHER)
    answer = kubelet.prepare(CLAIM, ("team-a", OTHER, "wrong-device")).claims
    assert answer[UID].error == "" and len(answer[UID].devices) == 1
    assert "device 'gpu-5' is not a device of this node" in answer[OTHER].error
    assert not (kubelet.root / "cdi" / f"infergrid.io-gpu_{OTHER}.json").exists()


def test_a_missing_claim_or_a_failing_api_server_is_the_claims_error(kubelet):
    missing = kubelet.prepare(("team-a", OTHER, "gone")).claims[OTHER].error
    assert "does not exist in the API server" in missing
    kubelet.api.failing = True
    failing = kubelet.prepare(CLAIM).claims[UID].error
    assert "reading it from the API server failed" in failing and "503" in failing


def test_hostile_requests_get_answers_not_crashes(kubelet):
    assert dict(kubelet.prepare().claims) == {}
    assert list(kubelet.prepare(CLAIM, CLAIM).claims) == [UID]
    huge = kubelet.prepare(("team-a", OTHER, "n" * 1_000_000)).claims[OTHER].error
    assert "is not a ResourceClaim name" in huge and len(huge) < 1100
    bad_uid = kubelet.prepare(("team-a", "../../x", "llm-gpu")).claims["../../x"].error
    assert "is not a Kubernetes UID" in bad_uid
    bad_namespace = kubelet.prepare(("Team A", OTHER, "c")).claims[OTHER].error
    assert "is not a namespace name" in bad_namespace
    assert list((kubelet.root / "cdi").iterdir()) == [
        kubelet.root / "cdi" / f"infergrid.io-gpu_{UID}.json"
    ]


def test_a_name_that_is_not_utf8_is_refused_and_the_driver_keeps_serving(kubelet):
    """A lone surrogate cannot be encoded by a client; on the wire it is invalid UTF-8,
    which the server refuses to decode, answering an error status and staying up."""
    name = "\ud800".encode("utf-8", "surrogatepass")
    raw_claim = b"\x0a\x06team-a\x12" + bytes([len(UID)]) + UID.encode() + b"\x1a\x03" + name
    raw = b"\x0a" + bytes([len(raw_claim)]) + raw_claim
    channel = kubelet.channel(kubelet.register().endpoint)
    call = channel.unary_unary(
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        request_serializer=None,
        response_deserializer=None,
    )
    with pytest.raises(grpc.RpcError) as caught:
        call(raw, timeout=5)
    assert caught.value.code() in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)
    assert kubelet.prepare(CLAIM).claims[UID].error == ""


def test_stop_removes_both_sockets(kubelet):
    kubelet.plugin.stop()
    assert list((kubelet.root / "registry").iterdir()) == []
    assert not (kubelet.root / "plugin" / "dra.sock").exists()
