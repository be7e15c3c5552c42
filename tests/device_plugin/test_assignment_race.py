"""Issue 37, point 9: a pod placed past the extender never gets another pod's assignment.

The kubelet's Allocate names devices, not pods. A pod created with `spec.nodeName` and
a GPU request, but no assignment, waits beside a pod the extender assigned; when the
kubelet asks for devices both could be asking for, its PodResources tells which pod it
is admitting (it lists a pod from the moment it starts admitting it): the assigned pod
is granted, the intruder refused. Where PodResources cannot tell, both are refused.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from device_plugin.allocator import AllocationError, grant
from device_plugin.fake_pod_resources import FakePodResources
from device_plugin.ledger import Ledger
from device_plugin.pod_resources import PodResourcesClient
from infergrid.constants import RESOURCE_GPU, RESOURCE_VGPU, mig_resource
from infergrid.records import PodRecord, pod_record
from tests.device_plugin.conftest import pod, share, whole
from tests.device_plugin.test_allocator import CONFIG, DEVICES, UUIDS
from tests.device_plugin.test_kubelet_protocol import allocate, mounted
from tests.device_plugin.test_pod_resources import wait_for


def intruder(node: str, limits: dict[str, str], name: str = "intruder", **spec) -> PodRecord:
    """A pod as the API server lists it after a tenant created it with `spec.nodeName`."""
    container = {"name": "main", "image": "x", "resources": {"limits": limits}}
    return pod_record(
        {
            "metadata": {"uid": f"uid-{name}", "namespace": "tenant", "name": name},
            "spec": {"nodeName": node, "containers": [container], **spec},
            "status": {"phase": "Pending"},
        }
    )


def failed(record: PodRecord) -> PodRecord:
    """The intruder after the kubelet failed its admission."""
    return replace(record, phase="Failed")


VICTIM = pod("victim", "n", whole("c", UUIDS[0], memory=1000))
SHARE_VICTIM = pod("victim", "n", share("c", UUIDS[0], 10))


@pytest.mark.parametrize("intruder_first", [True, False], ids=["intruder listed first", "last"])
def test_an_unassigned_pod_asking_for_the_same_devices_makes_the_request_ambiguous(
    intruder_first,
):
    rival = intruder("n", {RESOURCE_GPU: "1"})
    pods = [rival, VICTIM] if intruder_first else [VICTIM, rival]
    ledger = Ledger()
    with pytest.raises(AllocationError) as refused:
        grant([UUIDS[0]], DEVICES, "n", pods, ledger, CONFIG)
    assert str(refused.value).startswith(
        f"1 {RESOURCE_GPU} on node n may be for tenant/intruder/main, which has no GPU "
        "assignment, or for default/victim/c, which is assigned these devices"
    )
    assert ledger == Ledger()


def listing(*pods: PodRecord) -> set[tuple[str, str]]:
    """What the kubelet's PodResources lists: these pods."""
    return {(p.namespace, p.name) for p in pods}


def test_the_pod_the_kubelet_lists_is_the_one_asking():
    """The kubelet lists the pod it admits before Allocate; a waiting pod it does not list
    has not reached admission yet (or was rejected), so it is not the one asking."""
    rival = intruder("n", {RESOURCE_GPU: "1"})
    granted = grant([UUIDS[0]], DEVICES, "n", [rival, VICTIM], Ledger(), CONFIG, listing(VICTIM))
    assert granted.pending.pod.key == "default/victim"
    ledger = Ledger()
    with pytest.raises(AllocationError) as refused:
        grant([UUIDS[0]], DEVICES, "n", [rival, VICTIM], ledger, CONFIG, listing(rival))
    assert str(refused.value) == (
        f"1 {RESOURCE_GPU} on node n is asked for by tenant/intruder/main, which the kubelet "
        "is admitting with no GPU assignment (a pod gets GPUs through infergrid-scheduler, "
        "not by setting spec.nodeName)"
    )
    assert ledger == Ledger()


@pytest.mark.parametrize("listed", [set(), None, "both"], ids=["neither", "no answer", "both"])
def test_when_the_kubelet_does_not_tell_them_apart_neither_is_granted(listed):
    rival = intruder("n", {RESOURCE_GPU: "1"})
    listed = listing(rival, VICTIM) if listed == "both" else listed
    with pytest.raises(AllocationError, match="does not tell them apart"):
        grant([UUIDS[0]], DEVICES, "n", [rival, VICTIM], Ledger(), CONFIG, listed)


def test_the_assigned_pod_is_granted_once_the_intruder_has_failed():
    rival = intruder("n", {RESOURCE_VGPU: "1", "infergrid.io/gpu-memory": "10"})
    with pytest.raises(AllocationError, match="tenant/intruder/main"):
        grant([f"{UUIDS[0]}::vgpu-0"], DEVICES, "n", [rival, SHARE_VICTIM], Ledger(), CONFIG)
    granted = grant(
        [f"{UUIDS[0]}::vgpu-0"], DEVICES, "n", [failed(rival), SHARE_VICTIM], Ledger(), CONFIG
    )
    assert granted.pending.pod.key == "default/victim"


@pytest.mark.parametrize(
    "rival",
    [
        intruder("n", {RESOURCE_GPU: "2"}),
        intruder("n", {RESOURCE_VGPU: "1"}),
        intruder("n", {mig_resource("1g.10gb"): "1"}),
        intruder("elsewhere", {RESOURCE_GPU: "1"}),
        failed(intruder("n", {RESOURCE_GPU: "1"})),
        intruder("n", {"cpu": "1"}),
    ],
    ids=["two GPUs", "a share", "a MIG device", "on another node", "failed", "no GPU"],
)
def test_a_pod_that_cannot_be_making_the_request_does_not_block_it(rival):
    granted = grant([UUIDS[0]], DEVICES, "n", [rival, VICTIM], Ledger(), CONFIG)
    assert granted.pending.pod.key == "default/victim"


def test_a_container_the_kubelet_shows_holding_devices_no_longer_waits():
    """After a plugin restart the ledger holds what the kubelet shows: such a pod is admitted."""
    rival = intruder("n", {RESOURCE_GPU: "1"})
    ledger = Ledger()
    ledger.honoured[(rival.uid, "main")] = whole("main", UUIDS[1], memory=1000)
    granted = grant([UUIDS[0]], DEVICES, "n", [rival, VICTIM], ledger, CONFIG)
    assert granted.pending.pod.key == "default/victim"


pods_waiting = st.lists(
    st.tuples(
        st.sampled_from(["n", "elsewhere"]),
        st.sampled_from(["Pending", "Running", "Failed", "Succeeded"]),
        st.sampled_from([{RESOURCE_GPU: "1"}, {RESOURCE_GPU: "2"}, {"cpu": "1"}]),
    ),
    max_size=4,
)


@settings(max_examples=200, deadline=None)
@given(pods_waiting, st.randoms(use_true_random=False))
def test_the_intruder_is_never_granted_whoever_the_kubelet_admits(waiting, rnd):
    """The kubelet admits one of the pods that could be asking for this GPU and lists it
    (and perhaps pods it rejected before): the grant is made exactly when that is the
    victim, and a refusal names the pod it admits."""
    rivals = [
        replace(intruder(node, limits, name=f"i{k}"), phase=phase)
        for k, (node, phase, limits) in enumerate(waiting)
    ]
    pods = [VICTIM, *rivals]
    rnd.shuffle(pods)
    asking = [r for r in rivals if r.node_name == "n" and r.phase in ("Pending", "Running")
              and r.device_requests and r.device_requests[0].count == 1]  # fmt: skip
    admitted = rnd.choice([VICTIM, *asking])
    gone = [r for r in rivals if r.phase in ("Failed", "Succeeded")]
    listed = listing(admitted, *rnd.sample(gone, rnd.randint(0, len(gone))))
    try:
        granted = grant([UUIDS[0]], DEVICES, "n", pods, Ledger(), CONFIG, listed)
    except AllocationError as refused:
        assert admitted is not VICTIM and admitted.key in str(refused)
    else:
        assert admitted is VICTIM and granted.pending.pod.key == "default/victim"


@settings(max_examples=200, deadline=None)
@given(pods_waiting, st.randoms(use_true_random=False))
def test_no_grant_is_made_while_a_pod_without_assignment_could_be_its_holder(waiting, rnd):
    """Without PodResources, no grant while an unassigned pod could be the one asking."""
    rivals = [
        replace(intruder(node, limits, name=f"i{k}"), phase=phase)
        for k, (node, phase, limits) in enumerate(waiting)
    ]
    pods = [VICTIM, *rivals]
    rnd.shuffle(pods)
    could_be = [
        r
        for r in rivals
        if r.node_name == "n" and r.phase in ("Pending", "Running")
        and any((d.resource, d.count) == (RESOURCE_GPU, 1) for d in r.device_requests)
    ]  # fmt: skip
    ledger = Ledger()
    try:
        granted = grant([UUIDS[0]], DEVICES, "n", pods, ledger, CONFIG)
    except AllocationError as refused:
        assert could_be and all(r.key in str(refused) for r in could_be)
        assert ledger == Ledger()
    else:
        assert not could_be and granted.pending.pod.key == "default/victim"


# Through the kubelet's gRPC, as the kubelet admits the two pods.


@pytest.mark.parametrize("intruder_created_first", [True, False], ids=["intruder first", "last"])
def test_racing_allocates_never_give_the_intruder_the_victims_gpu(
    start_plugin, intruder_created_first
):
    """Without PodResources: both pods wait and two Allocates of the victim's GPU come at
    once: both are refused and nothing is granted. Once the kubelet has failed the
    intruder, the victim's next Allocate is granted to the victim."""
    p = start_plugin("l4-0")
    p.kubelet.wait_registered({RESOURCE_GPU})
    g = p.gpu(0).uuid
    victim = pod("victim", "l4-0", whole("c", g), age_s=0 if intruder_created_first else -5)
    rival = intruder("l4-0", {RESOURCE_GPU: "1"})
    p.pods.items = [rival, victim] if intruder_created_first else [victim, rival]
    stub = p.kubelet.plugin(RESOURCE_GPU)
    barrier = threading.Barrier(2)

    def admit(_: int) -> str:
        barrier.wait()
        try:
            allocate(stub, [g])
            return "granted"
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
            return err.details()

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(admit, range(2)))
    assert all("tenant/intruder/main" in r and "default/victim/c" in r for r in results)
    assert p.granted == [] and p.runtime.manager.ledger == Ledger()

    p.pods.items = [failed(rival), victim]
    assert mounted(allocate(stub, [g]).container_responses[0]) == [g]
    assert [x.pending.pod.key for x in p.granted] == ["default/victim"]


@pytest.mark.parametrize("intruder_first", [True, False], ids=["intruder first", "victim first"])
def test_the_kubelets_pod_resources_say_whose_allocate_it_is(
    start_plugin, short_dir, intruder_first
):
    """Over real gRPC, with PodResources: the kubelet admits the two pods one after the
    other, in either order, listing each as it admits it and dropping the intruder once it
    rejected it. The victim is granted its GPU, the intruder is refused, by name."""
    listed = FakePodResources(short_dir / "pod-resources.sock")
    listed.start()
    try:
        p = start_plugin("l4-0", held=PodResourcesClient(str(listed.socket)))
        p.kubelet.wait_registered({RESOURCE_VGPU})
        g = p.gpu(0).uuid
        victim = pod("victim", "l4-0", share("main", g, 1024))
        rival = intruder("l4-0", {RESOURCE_VGPU: "1", "infergrid.io/gpu-memory": "1024"})
        p.pods.items = [rival, victim]
        stub, slot = p.kubelet.plugin(RESOURCE_VGPU), f"{g}::vgpu-0"
        refusals = []
        for admitted in [rival, victim] if intruder_first else [victim, rival]:
            listed.admit(admitted.namespace, admitted.name, "main")
            try:
                allocate(stub, [slot])
                listed.hold(admitted.namespace, admitted.name, "main", RESOURCE_VGPU, slot)
            except grpc.RpcError as err:
                refusals.append(err.details())
                listed.release(admitted.namespace, admitted.name)  # rejected: no longer listed
        assert wait_for(lambda: p.granted)  # marked once PodResources shows the holder
        assert [x.pending.pod.key for x in p.granted] == ["default/victim"]
        (refusal,) = refusals
        assert "victim" not in refusal
        if intruder_first:
            assert "asked for by tenant/intruder/main, which the kubelet is admitting" in refusal
    finally:
        listed.stop()
