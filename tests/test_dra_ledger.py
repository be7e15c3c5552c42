"""The DRA ledger's decoding: slices become the device plugin's inventory, allocated claims
become assignments, a claim's requests become a pod's GPU containers; every bad field is a
ContractError that names it."""

import copy
from typing import Any

import pytest

from infergrid.assignment_annotation import AssignedGpu, AssignedMig, ContainerAssignment
from infergrid.dra_ledger import (
    ClaimMissing,
    claim_record,
    claim_requests,
    holdings,
    pod_claim_containers,
)
from infergrid.dra_slices import decode_slice, pool_inventory, slice_record
from infergrid.errors import ContractError
from infergrid.inventory import GpuLink, MigInstance
from infergrid.pod_request import ContainerGpuRequest, parse_pod_request
from infergrid.records import BOTH_MODES, NodeRecord, with_slices
from tests.scheduler_extender.dra_objects import (
    A100_MIB,
    claim,
    claim_pod,
    gpu,
    mig,
    mig_request,
    resource_slice,
    result,
    share_request,
    whole_request,
)


def devices_of(*devices: dict[str, Any]) -> dict:
    return pool_inventory("dra-a", [slice_record(resource_slice("dra-a", list(devices)))])[1]


# Slices -> inventory.


def test_a_slice_gives_the_inventory_the_annotation_would():
    found = slice_record(resource_slice("dra-a", [gpu(0, clique="c"), gpu(1, clique="c"), gpu(2)]))
    inventory, devices = pool_inventory("dra-a", [found])
    first = inventory.gpus[0]
    assert inventory.node == "dra-a" and [g.index for g in inventory.gpus] == [0, 1, 2]
    assert (first.uuid, first.model, first.memory_mib, first.sm_count) == (
        "GPU-dra-a-0",
        "NVIDIA A100-SXM4-80GB",
        A100_MIB,
        108,
    )
    assert (first.compute_capability, first.numa_node, first.healthy) == ("8.0", 0, True)
    assert first.links == (GpuLink(1, "nvlink", 1),) and inventory.gpus[2].links == ()
    assert devices["gpu-0"].shareable and devices["gpu-0"].gpu_uuid == "GPU-dra-a-0"


def test_mig_devices_become_instances_of_their_parent():
    inventory, devices = pool_inventory(
        "dra-a", [slice_record(resource_slice("dra-a", [mig(0, 0), mig(0, 1, profile="1g.10gb")]))]
    )
    (parent,) = inventory.gpus
    assert parent.mig_enabled and parent.uuid == "GPU-dra-a-0"
    assert parent.mig_instances == (
        MigInstance("3g.40gb", "MIG-dra-a-0-0", 40192, 0),
        MigInstance("1g.10gb", "MIG-dra-a-0-1", 40192, 0),
    )
    assert devices["mig-0-1"].mig == AssignedMig("MIG-dra-a-0-1", "1g.10gb", "GPU-dra-a-0")


def test_a_listed_parent_gpu_keeps_its_model_and_gets_its_instances():
    inventory, _ = pool_inventory(
        "dra-a", [slice_record(resource_slice("dra-a", [gpu(0, shareable=False), mig(0, 0)]))]
    )
    (parent,) = inventory.gpus
    assert parent.model.startswith("NVIDIA A100") and parent.mig_enabled
    assert len(parent.mig_instances) == 1


def test_qualified_attribute_names_read_like_short_ones():
    device = gpu(0)
    device["attributes"] = {f"gpu.infergrid.io/{k}": v for k, v in device["attributes"].items()}
    inventory, _ = pool_inventory("dra-a", [slice_record(resource_slice("dra-a", [device]))])
    assert inventory.gpus[0].uuid == "GPU-dra-a-0"


def test_a_tainted_device_is_not_healthy():
    device = gpu(0)
    device["taints"] = [{"key": "infergrid.io/xid", "effect": "NoSchedule"}]
    inventory, _ = pool_inventory("dra-a", [slice_record(resource_slice("dra-a", [device]))])
    assert not inventory.gpus[0].healthy


def _broken(path: list[Any], value: Any) -> dict[str, Any]:
    obj = resource_slice("dra-a", [gpu(0)])
    target = obj
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return obj


_DELETE = object()
_DEVICE = ["spec", "devices", 0]
_ATTRS = [*_DEVICE, "attributes"]


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (["spec", "driver"], "gpu.other.io", "spec.driver"),
        (["spec", "nodeName"], "dra-b", "spec.nodeName"),
        (["spec", "nodeName"], _DELETE, "spec.nodeName"),
        (["spec", "pool"], "dra-a", "spec.pool"),
        (["spec", "pool", "generation"], -1, "spec.pool.generation"),
        (["spec", "pool", "resourceSliceCount"], 0, "spec.pool.resourceSliceCount"),
        (["spec", "devices"], {}, "spec.devices"),
        ([*_DEVICE, "name"], "", "spec.devices[0].name"),
        ([*_ATTRS, "type"], {"string": "fpga"}, "spec.devices[0].attributes.type"),
        ([*_ATTRS, "type"], _DELETE, "spec.devices[0].attributes.type"),
        ([*_ATTRS, "uuid"], {"int": 3}, "spec.devices[0].attributes.uuid"),
        ([*_ATTRS, "uuid"], {"string": ""}, "spec.devices[0].attributes.uuid.string"),
        ([*_ATTRS, "model"], "A100", "spec.devices[0].attributes.model"),
        ([*_ATTRS, "index"], {"int": -1}, "spec.devices[0].attributes.index"),
        ([*_ATTRS, "index"], {"int": True}, "spec.devices[0].attributes.index.int"),
        ([*_ATTRS, "smCount"], {"int": "108"}, "spec.devices[0].attributes.smCount.int"),
        ([*_ATTRS, "computeCapability"], {"version": "8"},
         "spec.devices[0].attributes.computeCapability"),
        ([*_ATTRS, "computeCapability"], {"string": "8.0.0"},
         "spec.devices[0].attributes.computeCapability"),
        ([*_ATTRS, "numaNode"], {"int": -2}, "spec.devices[0].attributes.numaNode"),
        ([*_ATTRS, "nvlinkClique"], {"int": 1}, "spec.devices[0].attributes.nvlinkClique"),
        ([*_DEVICE, "capacity"], _DELETE, "spec.devices[0].capacity"),
        ([*_DEVICE, "capacity", "memory", "value"], "lots",
         "spec.devices[0].capacity.memory.value"),
        ([*_DEVICE, "capacity", "memory", "value"], "1Ki",
         "spec.devices[0].capacity.memory.value"),
        ([*_DEVICE, "allowMultipleAllocations"], "yes",
         "spec.devices[0].allowMultipleAllocations"),
        ([*_DEVICE, "taints"], {}, "spec.devices[0].taints"),
    ],
)  # fmt: skip
def test_every_bad_slice_field_is_named(path, value, field):
    with pytest.raises(ContractError) as err:
        decode_slice(_broken(path, value))
    assert err.value.field == field
    assert slice_record(_broken(path, value)).problem == str(err.value)


@pytest.mark.parametrize(
    ("attribute", "value", "field"),
    [
        ("migProfile", {"string": "big"}, "spec.devices[0].attributes.migProfile"),
        ("parentUUID", _DELETE, "spec.devices[0].attributes.parentUUID"),
        ("parentIndex", {"int": -3}, "spec.devices[0].attributes.parentIndex"),
    ],
)
def test_every_bad_mig_field_is_named(attribute, value, field):
    obj = resource_slice("dra-a", [mig(0, 0)])
    attrs = obj["spec"]["devices"][0]["attributes"]
    if value is _DELETE:
        del attrs[attribute]
    else:
        attrs[attribute] = value
    with pytest.raises(ContractError) as err:
        decode_slice(obj)
    assert err.value.field == field


def test_two_devices_of_one_name_are_refused():
    with pytest.raises(ContractError, match="spec.devices\\[1\\].name"):
        decode_slice(resource_slice("dra-a", [gpu(0), gpu(0)]))


@pytest.mark.parametrize(
    ("slices", "reason"),
    [
        ([], "has no slice"),
        ([resource_slice("dra-a", [gpu(0)], count=2)], "incomplete"),
        ([resource_slice("dra-a", [gpu(0)]), resource_slice("dra-a", [gpu(1)], name="two")],
         "incomplete"),
        ([resource_slice("dra-a", [gpu(0)], count=2),
          resource_slice("dra-a", [gpu(0, memory_mib=10)], count=2, name="two")], "twice"),
        ([resource_slice("dra-a", [gpu(0)], count=2),
          resource_slice("dra-a", [{**gpu(0), "name": "gpu-9"}], count=2, name="two")],
         "GPU index"),
        ([resource_slice("dra-a", [{**gpu(0), "capacity": {}}])], "resourceslices"),
    ],
)  # fmt: skip
def test_a_pool_that_does_not_add_up_is_refused(slices, reason):
    with pytest.raises(ContractError, match=reason):
        pool_inventory("dra-a", [slice_record(s) for s in slices])


def test_only_the_newest_generation_of_a_pool_counts():
    old = resource_slice("dra-a", [gpu(0), gpu(1)], generation=1, name="old")
    new = resource_slice("dra-a", [gpu(0)], generation=2, name="new")
    inventory, _ = pool_inventory("dra-a", [slice_record(old), slice_record(new)])
    assert [g.index for g in inventory.gpus] == [0]


def test_a_node_with_slices_is_a_dra_node_and_one_with_both_modes_offers_nothing():
    plain = NodeRecord("dra-a", None, None, None)
    record, devices = with_slices(plain, [slice_record(resource_slice("dra-a", [gpu(0)]))])
    assert record.dra and record.inventory is not None and record.usage is not None
    assert record.problem is None and set(devices) == {"gpu-0"}
    both, devices = with_slices(
        NodeRecord("dra-a", record.inventory, None, None),
        [slice_record(resource_slice("dra-a", [gpu(0)]))],
    )
    assert both.inventory is None and BOTH_MODES in (both.problem or "") and devices == {}
    assert with_slices(plain, []) == (plain, {})


# Allocated claims -> holdings.


def held(*results: dict[str, Any], devices: dict | None = None, reserved=("pod-1",)):
    record = claim_record(claim("c", [whole_request()], list(results), reserved))
    return holdings(record, devices if devices is not None else devices_of(gpu(0), gpu(1)))


def test_a_claim_asking_no_capacity_holds_the_gpu_whole():
    (container,) = held(result("gpu-0"))
    assert container.gpus == (AssignedGpu("GPU-dra-a-0", A100_MIB, 100),) and not container.shared


def test_a_claim_that_consumed_all_the_memory_holds_the_gpu_whole():
    (container,) = held(result("gpu-0", memory_mib=A100_MIB, cores=0))
    assert not container.shared and container.gpus[0].cores == 100


def test_a_share_holds_the_memory_and_cores_it_consumed():
    (container,) = held(result("gpu-1", memory_mib=20480, cores=25))
    assert container.shared and container.gpus == (AssignedGpu("GPU-dra-a-1", 20480, 25),)


def test_a_device_without_consumable_capacity_is_held_whole_whatever_it_says():
    devices = devices_of(gpu(0, shareable=False))
    (container,) = held(result("gpu-0", memory_mib=1024), devices=devices)
    assert not container.shared and container.gpus[0].memory_mib == A100_MIB


def test_a_mig_result_holds_its_instance():
    (container,) = held(result("mig-0-1"), devices=devices_of(mig(0, 0), mig(0, 1)))
    assert container.mig == AssignedMig("MIG-dra-a-0-1", "3g.40gb", "GPU-dra-a-0")


def test_other_drivers_results_admin_access_and_unknown_devices_hold_nothing():
    admin = {**result("gpu-0"), "adminAccess": True}
    assert held(result("gpu-0", driver="nic.example.com"), admin, result("gpu-7")) == ()


def test_a_claim_names_its_pods_and_whether_it_is_allocated():
    pending = claim_record(claim("c", [whole_request()]))
    assert not pending.allocated and pending.held == () and pending.reserved_for == ()
    done = claim_record(claim("c", [whole_request()], [result("gpu-0")], ("p1", "p2")))
    assert done.allocated and done.reserved_for == ("p1", "p2") and done.pools == {"dra-a"}


@pytest.mark.parametrize(
    ("status", "field"),
    [
        ({"allocation": []}, "status.allocation"),
        ({"allocation": {"devices": {"results": [{"driver": "gpu.infergrid.io"}]}}},
         "status.allocation.devices.results[0].request"),
        ({"allocation": {"devices": {"results": [
            {**result("gpu-0"), "consumedCapacity": {"memory": "-1"}}]}}},
         "status.allocation.devices.results[0].consumedCapacity.memory"),
        ({"allocation": {"devices": {"results": [
            {**result("gpu-0"), "consumedCapacity": {"cores": "101"}}]}}},
         "status.allocation.devices.results[0].consumedCapacity.cores"),
        ({"reservedFor": [{"resource": "pods", "name": "p"}]}, "status.reservedFor[0].uid"),
        ({"reservedFor": "p"}, "status.reservedFor"),
    ],
)  # fmt: skip
def test_an_unreadable_allocation_is_a_problem_that_names_the_field(status, field):
    record = claim_record({**claim("c", [whole_request()]), "status": status})
    assert record.problem is not None and record.problem.startswith(field)


# What a claim asks for.


def test_each_class_becomes_the_container_kind_it_stands_for():
    asked = claim_requests(
        claim(
            "c",
            [
                whole_request("w", 2),
                share_request("s", 20480, cores=30),
                mig_request("m", "1g.10gb"),
                {"name": "g", "exactly": {"deviceClassName": "gpu.infergrid.io",
                                          "capacity": {"requests": {"memory": "10Gi"}}}},
                {"name": "nic", "exactly": {"deviceClassName": "nic.example.com"}},
            ],
        )
    )  # fmt: skip
    assert asked == (
        ContainerGpuRequest("w", "whole", gpus=2),
        ContainerGpuRequest("s", "share", gpus=1, memory_mib=20480, cores=30),
        ContainerGpuRequest("m", "mig", mig_profile="1g.10gb"),
        ContainerGpuRequest("g", "share", gpus=1, memory_mib=10240),
    )


def _exactly(**fields: Any) -> dict[str, Any]:
    return claim(
        "c", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.infergrid.io", **fields}}]
    )


_WHERE = "spec.devices.requests[0].exactly"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (_exactly(allocationMode="All"), f"{_WHERE}.allocationMode"),
        (_exactly(count=0), f"{_WHERE}.count"),
        (_exactly(count="2"), f"{_WHERE}.count"),
        (_exactly(count=2, capacity={"requests": {"memory": "1Gi"}}), f"{_WHERE}.count"),
        (_exactly(capacity={"requests": {"memory": "lots"}}),
         f"{_WHERE}.capacity.requests.memory"),
        (_exactly(capacity={"requests": {"memory": "0"}}), f"{_WHERE}.capacity.requests.memory"),
        (_exactly(capacity={"requests": {"cores": "101", "memory": "1Gi"}}),
         f"{_WHERE}.capacity.requests.cores"),
        (_exactly(capacity={"requests": {"cores": "50"}}), f"{_WHERE}.capacity.requests"),
        (_exactly(capacity={"requests": {"sms": "1"}}), f"{_WHERE}.capacity.requests.sms"),
        (_exactly(capacity=[]), f"{_WHERE}.capacity"),
        (_exactly(deviceClassName=3), f"{_WHERE}.deviceClassName"),
        (claim("c", [{"name": "gpu", "exactly": {"deviceClassName": "gpu-share.infergrid.io"}}]),
         f"{_WHERE}.capacity.requests"),
        (claim("c", [{"name": "gpu", "exactly": {"deviceClassName": "mig.gpu.infergrid.io"}}]),
         f"{_WHERE}.selectors"),
        (claim("c", [mig_request("gpu", "9g.1tb")]), f"{_WHERE}.selectors[0].cel.expression"),
        (claim("c", [{"name": "gpu", "firstAvailable": [
            {"name": "a", "deviceClassName": "gpu.infergrid.io"}]}]),
         "spec.devices.requests[0].firstAvailable[0].deviceClassName"),
        (claim("c", [{"exactly": {"deviceClassName": "gpu.infergrid.io"}}]),
         "spec.devices.requests[0].name"),
        ({**claim("c", []), "spec": {"devices": {"requests": {}}}}, "spec.devices.requests"),
    ],
)  # fmt: skip
def test_every_bad_request_field_is_named(body, field):
    with pytest.raises(ContractError) as err:
        claim_requests(body)
    assert err.value.field == field
    assert claim_record(body).problem == str(err.value)


# A pod's claims.


def lookup_of(*claims: dict[str, Any]):
    records = {(c["metadata"]["namespace"], c["metadata"]["name"]): claim_record(c) for c in claims}
    return lambda namespace, name: records.get((namespace, name))


def test_a_claim_pod_asks_its_claims_requests_named_by_its_own_claim_names():
    pod = claim_pod("p1", {"weights": "p1-gpu-abc", "cache": "shared"})
    found = pod_claim_containers(
        pod, lookup_of(claim("p1-gpu-abc", [share_request()]), claim("shared", [whole_request()]))
    )
    assert [c.name for c in found] == ["weights/gpu", "cache/gpu"]
    request = parse_pod_request(pod, "binpack", lambda p: found)
    assert request.by_claim and request.gpu_containers == found


def test_a_generated_claim_is_found_through_the_pods_status():
    pod = claim_pod("p1", {})
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    with pytest.raises(ClaimMissing, match="not generated yet"):
        pod_claim_containers(pod, lookup_of())
    pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "p1-gpu-x"}]
    with pytest.raises(ClaimMissing, match="p1-gpu-x"):
        pod_claim_containers(pod, lookup_of())
    found = pod_claim_containers(pod, lookup_of(claim("p1-gpu-x", [whole_request()])))
    assert found == (ContainerGpuRequest("gpu/gpu", "whole", gpus=1),)


def test_an_allocated_claim_asks_for_nothing_more_and_a_bad_one_fails_the_pod():
    pod = claim_pod("p1", {"gpu": "c"})
    allocated = claim("c", [whole_request()], [result("gpu-0")], ("p1",))
    assert pod_claim_containers(pod, lookup_of(allocated)) == ()
    bad = claim("c", [{"name": "gpu", "exactly": {"deviceClassName": "gpu.infergrid.io",
                                                   "count": 0}}])  # fmt: skip
    with pytest.raises(ContractError, match="ResourceClaim default/c"):
        pod_claim_containers(pod, lookup_of(bad))


def test_a_claim_pod_may_not_ask_the_device_plugin_too():
    pod = claim_pod("p1", {"gpu": "c"})
    pod["spec"]["containers"].append(
        {"name": "side", "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    )
    with pytest.raises(ContractError, match="'side'.*by claim only"):
        parse_pod_request(pod, "binpack", lambda p: ())


def test_a_plain_pod_does_not_ask_by_claim_and_the_device_plugin_reads_claim_pods_as_empty():
    plain = copy.deepcopy(claim_pod("p1", {}))
    plain["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    assert not parse_pod_request(plain).by_claim
    request = parse_pod_request(claim_pod("p1", {"gpu": "c"}))
    assert request.by_claim and request.gpu_containers == ()


def test_a_hostile_pod_claim_list_is_named():
    pod = claim_pod("p1", {})
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": 7}]
    with pytest.raises(ContractError, match=r"spec.resourceClaims\[0\].resourceClaimName"):
        pod_claim_containers(pod, lookup_of())
    pod["spec"]["resourceClaims"] = "gpu"
    with pytest.raises(ContractError, match="spec.resourceClaims"):
        pod_claim_containers(pod, lookup_of())


def test_holdings_name_each_result_of_a_claim():
    found = held(result("gpu-0"), result("gpu-1", memory_mib=1024))
    assert [c.name for c in found] == ["default/c/gpu[0]", "default/c/gpu[1]"]
    assert all(isinstance(c, ContainerAssignment) and c.allocated for c in found)


def test_gpus_take_shares_only_where_every_gpu_allows_multiple_allocations():
    def slots(*devices):
        return pool_inventory("dra-a", [slice_record(resource_slice("dra-a", list(devices)))])[0]

    assert slots(gpu(0), gpu(1)).share_slots > 1
    assert slots(gpu(0), gpu(1, shareable=False)).share_slots == 0
