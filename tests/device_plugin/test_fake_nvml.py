"""The fake NVML: it reports what the fleet file says, and tests can steer it."""

import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infergrid.errors import ContractError
from infergrid.fleet import FAKE_ECC, FleetNode, load_fleet, parse_fleet
from infergrid.inventory import EccState
from infergrid.nvml.backend import GpuProcess, NvmlBackend, NvmlError, XidEvent
from infergrid.nvml.fake import FakeNvml, interpolate
from infergrid.nvml.fake_telemetry import GENERIC, NVLINK_SHARE, board_of

SAMPLE = Path(__file__).parents[2] / "e2e" / "fleets" / "sample.yaml"
NODES = {node.name: node for node in load_fleet(SAMPLE).nodes}


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


A100 = {
    "model": "NVIDIA A100-SXM4-80GB",
    "count": 4,
    "memoryMiB": 81920,
    "smCount": 108,
    "computeCapability": "8.0",
}


def four_gpu_node(**changes: object) -> FleetNode:
    doc = {"version": "v1", "nodes": [{"name": "n", "gpus": A100} | changes]}
    return parse_fleet(doc, "test").nodes[0]


def test_it_is_an_nvml_backend():
    assert isinstance(FakeNvml(NODES["h100"]), NvmlBackend)


@pytest.mark.parametrize("name", NODES)
def test_it_reports_every_gpu_of_the_fleet_node(name):
    node = NODES[name]
    fake = FakeNvml(node)
    assert fake.device_count() == len(node.inventory.gpus)
    for gpu in node.inventory.gpus:
        info = fake.device_info(gpu.index)
        assert (info.index, info.uuid, info.model) == (gpu.index, gpu.uuid, gpu.model)
        assert (info.memory_mib, info.sm_count, info.compute_capability) == (
            gpu.memory_mib,
            gpu.sm_count,
            gpu.compute_capability,
        )
        assert (info.numa_node, info.mig_enabled) == (gpu.numa_node, gpu.mig_enabled)


def test_the_sample_fleet_has_three_models():
    models = {FakeNvml(n).device_info(0).model for n in NODES.values()}
    assert models == {"NVIDIA A100-SXM4-80GB", "NVIDIA L4", "NVIDIA H100 80GB HBM3"}
    l4 = FakeNvml(NODES["l4-0"]).device_info(3)
    assert (l4.memory_mib, l4.sm_count, l4.compute_capability, l4.numa_node) == (
        23034,
        58,
        "8.9",
        1,
    )


def test_a_gpu_in_mig_mode_reports_its_instances():
    fake = FakeNvml(NODES["a100-1"])
    assert fake.device_info(0).mig_enabled
    instances = fake.mig_instances(0)
    assert [(m.profile, m.memory_mib, m.sm_count) for m in instances] == [
        ("3g.40gb", 40192, 46),
        ("3g.40gb", 40192, 46),
    ]
    assert len({m.uuid for m in instances}) == 2
    assert not fake.device_info(1).mig_enabled
    assert fake.mig_instances(1) == ()


def peers(fake: FakeNvml, index: int) -> dict[int, tuple[str, int]]:
    return {link.peer_index: (link.type, link.count) for link in fake.links(index)}


def test_nvswitch_links_every_gpu_to_every_other():
    fake = FakeNvml(NODES["a100-0"])
    for index in range(8):
        assert peers(fake, index) == {p: ("nvlink", 12) for p in range(8) if p != index}


def test_nvlink_pairs_link_only_partners():
    assert peers(FakeNvml(NODES["h100"]), 0) == {1: ("nvlink", 18)}
    fake = FakeNvml(four_gpu_node(topology={"nvlink": "pairs", "nvlinkCount": 4}))
    assert peers(fake, 2) == {0: ("numa", 0), 1: ("numa", 0), 3: ("nvlink", 4)}


def test_pcie_only_gpus_go_through_switches_and_numa_nodes():
    assert peers(FakeNvml(NODES["l4-0"]), 0) == {
        1: ("pcie-switch", 0),
        2: ("system", 0),
        3: ("system", 0),
    }


def test_memory_and_utilization_are_what_the_test_sets():
    fake = FakeNvml(NODES["l4-0"])
    assert (fake.memory_used_mib(1), fake.utilization_percent(1)) == (0, 0)
    fake.set_memory_used(1, 4096)
    fake.set_utilization(1, 75)
    assert (fake.memory_used_mib(1), fake.utilization_percent(1)) == (4096, 75)
    assert (fake.memory_used_mib(0), fake.utilization_percent(0)) == (0, 0)


def test_drifting_memory_follows_the_clock():
    clock = FakeClock()
    fake = FakeNvml(NODES["l4-0"], clock=clock)
    fake.drift_memory(0, [(2.0, 1000), (12.0, 3000), (22.0, 2000)])
    assert fake.memory_used_mib(0) == 1000
    clock.now += 7.0
    assert fake.memory_used_mib(0) == 2000
    clock.now += 10.0
    assert fake.memory_used_mib(0) == 2500
    clock.now += 100.0
    assert fake.memory_used_mib(0) == 2000
    fake.set_memory_used(0, 10)
    assert fake.memory_used_mib(0) == 10


@pytest.mark.parametrize(
    ("t", "value"), [(-1.0, 5), (0.0, 5), (1.0, 10), (4.0, 40), (5.0, 40), (9.0, 40)]
)
def test_interpolate_is_flat_outside_the_points(t, value):
    assert interpolate([(0.0, 5), (2.0, 15), (4.0, 40)], t) == value


def test_bad_simulation_settings_name_the_argument():
    fake = FakeNvml(NODES["l4-0"])
    with pytest.raises(ValueError, match="mib: GPU 0 has 23034 MiB"):
        fake.set_memory_used(0, 30000)
    with pytest.raises(ValueError, match="points: times must increase"):
        fake.drift_memory(0, [(5.0, 1), (1.0, 2)])
    with pytest.raises(ValueError, match="points: need at least one"):
        fake.drift_memory(0, [])
    with pytest.raises(ValueError, match="percent"):
        fake.set_utilization(0, 101)
    with pytest.raises(ValueError, match="index: l4-0 has no GPU 4"):
        fake.inject_xid(4, 79)
    with pytest.raises(ValueError, match="call: 'memory' is not one of"):
        fake.fail("memory")
    with pytest.raises(ValueError, match="index: device_count is not about one GPU"):
        fake.fail("device_count", 0)


def test_a_gpu_the_node_lacks_is_an_nvml_error():
    with pytest.raises(NvmlError) as caught:
        FakeNvml(NODES["h100"]).device_info(2)
    assert (caught.value.call, caught.value.index) == ("device_info", 2)


def test_injected_xids_come_out_once_in_order():
    fake = FakeNvml(NODES["h100"])
    fake.inject_xid(1, 79)
    fake.inject_xid(0, 48)
    uuids = [gpu.uuid for gpu in NODES["h100"].inventory.gpus]
    assert fake.wait_for_events(0) == (XidEvent(uuids[1], 79), XidEvent(uuids[0], 48))
    assert fake.wait_for_events(0) == ()


def test_a_waiting_reader_wakes_when_an_xid_arrives():
    fake = FakeNvml(NODES["h100"])
    threading.Timer(0.02, fake.inject_xid, (0, 79)).start()
    assert [event.xid for event in fake.wait_for_events(10)] == [79]


def test_the_fleets_xid_events_come_due_on_the_clock_from_when_the_fake_is_made():
    clock = FakeClock()
    events = [
        {"gpu": 1, "xid": 32, "afterSeconds": 2},
        {"gpu": 0, "xid": 48, "afterSeconds": 1},
        {"gpu": 3, "xid": 79, "afterSeconds": 1},
    ]
    node = four_gpu_node(xidEvents=events)
    uuids = [gpu.uuid for gpu in node.inventory.gpus]
    fake = FakeNvml(node, clock=clock)
    clock.now += 0.5
    assert fake.wait_for_events(0) == ()
    clock.now += 0.5
    assert fake.wait_for_events(0) == (XidEvent(uuids[0], 48), XidEvent(uuids[3], 79))
    clock.now += 60
    assert fake.wait_for_events(0) == (XidEvent(uuids[1], 32),)
    assert fake.wait_for_events(0) == ()


def test_a_waiting_reader_gets_a_scheduled_xid_once_it_is_due():
    node = four_gpu_node(xidEvents=[{"gpu": 2, "xid": 48, "afterSeconds": 0.02}])
    fake = FakeNvml(node)
    assert fake.wait_for_events(10) == (XidEvent(node.inventory.gpus[2].uuid, 48),)


def test_close_wakes_a_waiting_reader_and_later_calls_fail():
    fake = FakeNvml(NODES["h100"])
    woken: list[tuple] = []
    reader = threading.Thread(target=lambda: woken.append(fake.wait_for_events(10)))
    reader.start()
    # Closed only once the reader waits (a timer could fire first on a loaded machine).
    deadline = time.monotonic() + 10
    while not fake._event_queued._waiters and time.monotonic() < deadline:
        time.sleep(0.001)
    fake.close()
    reader.join(5)
    assert woken == [()] and not reader.is_alive()
    with pytest.raises(NvmlError, match="shut down"):
        fake.device_count()


def test_events_from_many_threads_are_all_delivered():
    fake = FakeNvml(NODES["a100-0"])
    senders = [
        threading.Thread(target=lambda i=i: [fake.inject_xid(i, 79) for _ in range(50)])
        for i in range(8)
    ]
    for sender in senders:
        sender.start()
    received: list[XidEvent] = []
    while len(received) < 400:
        received += fake.wait_for_events(10)
    for sender in senders:
        sender.join()
    assert len(received) == 400


def test_a_failed_call_raises_for_one_gpu_until_healed():
    fake = FakeNvml(NODES["l4-0"])
    fake.fail("memory_used_mib", 1)
    with pytest.raises(NvmlError) as caught:
        fake.memory_used_mib(1)
    assert (caught.value.call, caught.value.index) == ("memory_used_mib", 1)
    assert str(caught.value) == "memory_used_mib on GPU 1: injected failure"
    assert fake.memory_used_mib(0) == 0
    fake.heal("memory_used_mib", 1)
    assert fake.memory_used_mib(1) == 0


def test_a_failure_for_every_gpu_stays_until_healed_for_every_gpu():
    fake = FakeNvml(NODES["l4-0"])
    fake.fail("links")
    fake.fail("device_count")
    fake.heal(index=2)
    with pytest.raises(NvmlError):
        fake.links(2)
    with pytest.raises(NvmlError, match="device_count: injected failure"):
        fake.device_count()
    fake.heal("links")
    assert len(fake.links(2)) == 3
    fake.heal()
    assert fake.device_count() == 4


def test_a_gpu_listed_unhealthy_has_an_identity_but_no_readings():
    fake = FakeNvml(four_gpu_node(unhealthy=[2]))
    assert fake.device_info(2).index == 2
    for read in (fake.memory_used_mib, fake.utilization_percent):
        with pytest.raises(NvmlError, match="GPU is lost"):
            read(2)
        assert read(1) == 0
    fake.heal(index=2)
    assert fake.memory_used_mib(2) == 0


def test_every_gpu_starts_with_ecc_on_and_nothing_wrong():
    fake = FakeNvml(NODES["h100"])
    assert [fake.ecc_state(i) for i in range(2)] == [FAKE_ECC, FAKE_ECC]


def test_injected_ecc_values_change_only_what_they_name():
    fake = FakeNvml(NODES["h100"])
    fake.inject_ecc(1, volatile_double_bit=2, remap_pending=True)
    fake.inject_ecc(1, aggregate_double_bit=5)
    assert fake.ecc_state(1) == EccState(2, 5, 0, False, 0, True, False)
    assert fake.ecc_state(0) == FAKE_ECC
    with pytest.raises(ValueError, match="index: h100 has no GPU 2"):
        fake.inject_ecc(2, volatile_double_bit=1)
    with pytest.raises(TypeError):
        fake.inject_ecc(0, double_bit=1)


def test_the_fleets_ecc_events_come_due_on_the_clock_in_time_order():
    clock = FakeClock()
    events = [
        {"gpu": 1, "afterSeconds": 2, "aggregateDoubleBit": 3},
        {"gpu": 1, "afterSeconds": 1, "aggregateDoubleBit": 2, "retiredPagesPending": True},
        {"gpu": 0, "afterSeconds": 1, "remapFailed": True},
    ]
    fake = FakeNvml(four_gpu_node(eccEvents=events), clock=clock)
    clock.now += 0.5
    assert [fake.ecc_state(i) for i in range(4)] == [FAKE_ECC] * 4
    clock.now += 0.5
    assert fake.ecc_state(0) == EccState(0, 0, 0, False, 0, False, True)
    assert fake.ecc_state(1) == EccState(0, 2, 0, True, 0, False, False)
    clock.now += 60
    assert fake.ecc_state(1) == EccState(0, 3, 0, True, 0, False, False)
    assert fake.ecc_state(2) == FAKE_ECC


def test_an_ecc_read_can_be_made_to_fail():
    fake = FakeNvml(NODES["h100"])
    fake.fail("ecc_state", 0)
    with pytest.raises(NvmlError, match="ecc_state on GPU 0: injected failure"):
        fake.ecc_state(0)
    assert fake.ecc_state(1) == FAKE_ECC


# Telemetry: what a GPU of each model reads under the load a test gives it.

BUSY = st.integers(min_value=0, max_value=100)


@pytest.mark.parametrize("name", ["a100-0", "l4-0", "h100"])
@settings(max_examples=60, deadline=None)
@given(less=BUSY, more=BUSY)
def test_power_heat_and_traffic_rise_with_load_within_the_boards_limits(name, less, more):
    less, more = sorted((less, more))
    fake = FakeNvml(NODES[name], clock=FakeClock())
    fake.set_utilization(0, less)
    fake.set_utilization(1, more)
    low, high = fake.telemetry(0), fake.telemetry(1)
    board = board_of(NODES[name].inventory.gpus[0])
    assert board.idle_watts <= low.power_watts <= high.power_watts <= high.power_limit_watts
    assert high.power_limit_watts == board.max_watts
    assert low.temperature_celsius <= high.temperature_celsius
    assert low.pcie_rx_bytes_per_second <= high.pcie_rx_bytes_per_second
    assert board.idle_sm_mhz <= high.sm_clock_mhz <= board.max_sm_mhz
    assert fake.telemetry(1) == high  # the same load reads the same


def test_an_idle_gpu_idles_and_a_flat_out_one_is_held_at_its_power_limit():
    fake = FakeNvml(NODES["h100"])
    idle = fake.telemetry(0)
    assert (idle.power_watts, idle.sm_clock_mhz, idle.throttle_reasons) == (70.0, 345, 0x1)
    assert (idle.pcie_tx_bytes_per_second, idle.processes) == (0, ())
    fake.set_utilization(0, 100)
    fake.set_memory_used(0, 40000)
    busy = fake.telemetry(0)
    assert (busy.power_watts, busy.temperature_celsius, busy.throttle_reasons) == (700, 85, 0x4)
    assert busy.sm_clock_mhz < 1980  # the power cap holds the clock below its boost
    assert busy.processes == (GpuProcess(4000, 40000),)
    fake.set_utilization(0, 60)
    assert fake.telemetry(0).throttle_reasons == 0


def test_nvlink_bytes_count_up_on_the_clock_at_the_rate_the_load_sets():
    clock = FakeClock()
    fake = FakeNvml(NODES["h100"], clock=clock)
    assert fake.telemetry(0).nvlink_tx_bytes == 0
    fake.set_utilization(0, 100)
    clock.now += 10
    moved = fake.telemetry(0).nvlink_tx_bytes
    assert moved == 10 * 18 * 25 * 10**9 * NVLINK_SHARE  # 18 links of 25 GB/s, a tenth used
    fake.set_utilization(0, 0)
    clock.now += 10
    assert fake.telemetry(0).nvlink_rx_bytes == moved  # an idle GPU moves nothing


def test_a_pcie_gpu_has_no_nvlink_and_a_mig_gpu_no_utilisation_as_on_real_nvml():
    l4 = FakeNvml(NODES["l4-0"]).telemetry(0)
    assert (l4.nvlink_tx_bytes, l4.nvlink_rx_bytes) == (None, None)
    assert l4.power_watts is not None and l4.utilization_percent == 0
    fake = FakeNvml(NODES["a100-1"])
    fake.set_memory_used(0, 10001)
    mig = fake.telemetry(0)
    assert (mig.utilization_percent, mig.memory_bandwidth_percent, mig.processes) == (None,) * 3
    assert [m.uuid for m in mig.mig] == [m.uuid for m in fake.mig_instances(0)]
    assert [m.memory_used_mib for m in mig.mig] == [5001, 5000]
    assert [m.processes for m in mig.mig] == [(GpuProcess(4001, 5001),), (GpuProcess(4002, 5000),)]


def test_an_unknown_model_reads_as_a_generic_board():
    gpu = four_gpu_node(gpus={**A100, "model": "NVIDIA B200", "memoryMiB": 183000})
    assert board_of(gpu.inventory.gpus[0]) == GENERIC


def test_a_lost_gpu_has_no_telemetry_and_a_test_can_make_one_fail():
    fake = FakeNvml(four_gpu_node(unhealthy=[2]))
    with pytest.raises(NvmlError, match="telemetry on GPU 2: GPU is lost"):
        fake.telemetry(2)
    fake.fail("telemetry", 1)
    with pytest.raises(NvmlError, match="injected failure"):
        fake.telemetry(1)
    assert fake.telemetry(0).power_watts == 55.0


def test_the_pods_holding_a_gpu_keep_it_as_busy_as_the_fleet_says():
    """heldBusyPercent: each GPU's utilisation follows what its pods hold (a whole GPU at
    60%, a quarter of one at 15%, more than one GPU's worth capped at 100), an unheld GPU
    idles; a fleet that leaves it out keeps its GPUs as the test sets them."""
    fake = FakeNvml(four_gpu_node(heldBusyPercent=60))
    uuids = [fake.device_info(i).uuid for i in range(4)]
    fake.set_utilization(3, 90)
    fake.run({uuids[0]: 1.0, uuids[1]: 0.25, uuids[2]: 2.5})
    assert [fake.utilization_percent(i) for i in range(4)] == [60, 15, 100, 0]
    assert fake.telemetry(0).power_watts > fake.telemetry(3).power_watts  # the load shows
    idle = FakeNvml(NODES["h100"])
    idle.set_utilization(0, 30)
    idle.run({idle.device_info(0).uuid: 1.0})
    assert idle.utilization_percent(0) == 30


def test_held_busy_percent_out_of_range_is_named():
    with pytest.raises(ContractError) as caught:
        four_gpu_node(heldBusyPercent=101)
    assert caught.value.field == "nodes[0].heldBusyPercent"
