"""GPU health: faults flip a GPU unhealthy, quiet brings it back unless the GPU needs a reset."""

import threading
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from device_plugin.discovery import discover
from device_plugin.health import HealthMonitor, HealthTracker
from device_plugin.xid import APPLICATION_XIDS, RESET_XIDS
from infergrid.fleet import FAKE_ECC, load_fleet
from infergrid.inventory import EccState
from infergrid.nvml.backend import XidEvent
from infergrid.nvml.fake import FakeNvml

SAMPLE = Path(__file__).parents[2] / "e2e" / "fleets" / "sample.yaml"
NODES = {node.name: node for node in load_fleet(SAMPLE).nodes}
H100 = [gpu.uuid for gpu in NODES["h100"].inventory.gpus]
GPU = "GPU-test"
PASSING = 32  # an XID in neither list: a transient fault
PASSING_2 = 8
OFF_THE_BUS = "XID 79 (GPU has fallen off the bus): needs a GPU reset"


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def tracker(clock: FakeClock) -> HealthTracker:
    return HealthTracker(quiet_period_s=30, clock=clock)


def test_a_critical_xid_makes_a_gpu_unhealthy(tracker):
    assert tracker.is_healthy(GPU)
    tracker.record_xid(GPU, PASSING)
    assert not tracker.is_healthy(GPU)
    assert tracker.unhealthy() == {GPU: "XID 32"}
    assert tracker.version == 1


@pytest.mark.parametrize("xid", sorted(APPLICATION_XIDS))
def test_application_xids_leave_the_gpu_healthy(tracker, xid):
    tracker.record_xid(GPU, xid)
    assert tracker.is_healthy(GPU)
    assert tracker.version == 0


def test_a_gpu_recovers_after_the_quiet_period(tracker, clock):
    tracker.record_failure(GPU, "nvmlDeviceGetMemoryInfo on GPU 0: GPU is lost")
    clock.now += 29.9
    assert tracker.unhealthy() == {GPU: "nvmlDeviceGetMemoryInfo on GPU 0: GPU is lost"}
    clock.now += 0.1
    assert tracker.is_healthy(GPU)
    assert tracker.unhealthy() == {}
    assert tracker.version == 2


def test_a_new_fault_restarts_the_quiet_period_without_a_new_version(tracker, clock):
    tracker.record_xid(GPU, PASSING)
    clock.now += 20
    tracker.record_xid(GPU, PASSING_2)
    assert tracker.version == 1
    clock.now += 20
    assert tracker.unhealthy() == {GPU: "XID 8"}
    clock.now += 10
    assert tracker.is_healthy(GPU)


def test_a_critical_xid_after_recovery_flips_the_gpu_again(tracker, clock):
    tracker.record_xid(GPU, PASSING)
    clock.now += 30
    assert tracker.is_healthy(GPU)
    tracker.record_xid(GPU, PASSING_2)
    assert not tracker.is_healthy(GPU)
    assert tracker.version == 3


def test_gpus_are_tracked_apart(tracker, clock):
    tracker.record_xid("GPU-a", PASSING)
    clock.now += 15
    tracker.record_xid("GPU-b", PASSING)
    clock.now += 15
    assert tracker.unhealthy() == {"GPU-b": "XID 32"}


@pytest.mark.parametrize("xid", sorted(RESET_XIDS))
def test_an_xid_that_needs_a_reset_outlasts_any_quiet_period(tracker, clock, xid):
    tracker.record_xid(GPU, xid)
    clock.now += 86400
    assert not tracker.is_healthy(GPU)
    assert tracker.unhealthy()[GPU].endswith("needs a GPU reset")
    assert tracker.version == 1


def test_a_gpu_that_needs_a_reset_keeps_its_reason_through_later_faults(tracker, clock):
    tracker.record_xid(GPU, 48)
    tracker.record_xid(GPU, PASSING)
    tracker.record_failure(GPU, "memory_used_mib on GPU 0: GPU is lost")
    tracker.record_xid(GPU, 79)
    clock.now += 3600
    assert tracker.unhealthy() == {GPU: "XID 48 (double-bit ECC error): needs a GPU reset"}
    assert tracker.version == 1


def test_a_transient_fault_turns_into_a_needed_reset_without_a_new_version(tracker, clock):
    tracker.record_xid(GPU, PASSING)
    tracker.record_xid(GPU, 95)
    clock.now += 3600
    assert tracker.unhealthy() == {GPU: "XID 95 (uncontained ECC error): needs a GPU reset"}
    assert tracker.version == 1


def test_a_negative_quiet_period_is_refused():
    with pytest.raises(ValueError, match="quiet_period_s"):
        HealthTracker(quiet_period_s=-1)


def test_wait_for_change_returns_at_once_when_the_version_moved(tracker):
    tracker.record_xid(GPU, PASSING)
    assert tracker.wait_for_change(0, timeout=10) == 1


def test_wait_for_change_returns_the_same_version_on_timeout(tracker):
    assert tracker.wait_for_change(0, timeout=0) == 0


def test_wait_for_change_sees_a_recovery_on_the_trackers_clock(tracker, clock):
    tracker.record_xid(GPU, PASSING)
    clock.now += 30
    assert tracker.wait_for_change(1, timeout=0) == 2


def test_wait_for_change_wakes_when_another_thread_records_a_fault(tracker):
    threading.Timer(0.02, tracker.record_xid, (GPU, PASSING)).start()
    assert tracker.wait_for_change(0, timeout=10) == 1


def test_wait_for_change_wakes_at_the_recovery_deadline():
    tracker = HealthTracker(quiet_period_s=0.05)
    tracker.record_xid(GPU, PASSING)
    assert tracker.wait_for_change(1, timeout=10) == 2
    assert tracker.is_healthy(GPU)


def test_wait_for_change_does_not_wake_for_a_gpu_that_needs_a_reset(tracker):
    tracker.record_xid(GPU, 48)
    assert tracker.wait_for_change(1, timeout=0.05) == 1


def monitor_of(fake: FakeNvml, tracker: HealthTracker) -> HealthMonitor:
    return HealthMonitor(fake, tracker, threading.Event(), interval_s=0.01)


def test_the_monitor_records_xid_events(tracker):
    fake = FakeNvml(NODES["h100"])
    fake.inject_xid(1, 79)
    fake.inject_xid(0, 43)
    monitor_of(fake, tracker).check_once()
    assert tracker.unhealthy() == {
        H100[1]: "XID 79 (GPU has fallen off the bus): needs a GPU reset"
    }


def test_a_double_bit_ecc_error_holds_a_gpu_until_the_plugin_restarts(tracker, clock):
    """XID 48 outlasts the quiet period that clears a passing XID; a restart, after the
    reset it stands for, starts with every GPU healthy."""
    fake = FakeNvml(NODES["h100"])
    fake.inject_xid(0, 48)
    fake.inject_xid(1, PASSING)
    monitor_of(fake, tracker).check_once()
    assert set(tracker.unhealthy()) == {H100[0], H100[1]}
    clock.now += 31
    monitor_of(fake, tracker).check_once()
    assert tracker.unhealthy() == {H100[0]: "XID 48 (double-bit ECC error): needs a GPU reset"}
    restarted = HealthTracker(quiet_period_s=30, clock=clock)
    monitor_of(fake, restarted).check_once()
    assert restarted.unhealthy() == {}


def test_the_monitor_marks_a_gpu_that_fails_its_probe(tracker):
    fake = FakeNvml(NODES["h100"])
    monitor = monitor_of(fake, tracker)
    monitor.check_once()
    fake.fail("memory_used_mib", 0)
    fake.fail("device_info", 0)
    monitor.check_once()
    assert tracker.unhealthy() == {H100[0]: "memory_used_mib on GPU 0: injected failure"}


def test_the_monitor_survives_nvml_errors(tracker, caplog):
    fake = FakeNvml(NODES["h100"])
    fake.fail("wait_for_events")
    fake.fail("device_info", 1)
    monitor = monitor_of(fake, tracker)
    monitor.check_once()
    fake.fail("device_count")
    monitor.check_once()
    assert tracker.unhealthy() == {}
    assert "cannot read XID events" in caplog.text
    assert "GPU 1 cannot be identified" in caplog.text
    assert "cannot count GPUs" in caplog.text


def test_the_monitor_thread_reports_faults_and_stops_promptly():
    fake = FakeNvml(NODES["h100"])
    tracker = HealthTracker(quiet_period_s=60)
    stop = threading.Event()
    thread = threading.Thread(target=HealthMonitor(fake, tracker, stop, interval_s=0.05).run)
    thread.start()
    fake.inject_xid(0, 79)
    assert tracker.wait_for_change(0, timeout=10) == 1
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert tracker.unhealthy() == {
        H100[0]: "XID 79 (GPU has fallen off the bus): needs a GPU reset"
    }


class BrokenNvml(FakeNvml):
    """A backend with a bug: its event call raises something other than NvmlError."""

    def __init__(self, stop: threading.Event) -> None:
        super().__init__(NODES["h100"])
        self.stop = stop
        self.calls = 0

    def wait_for_events(self, timeout_s: float) -> tuple[XidEvent, ...]:
        self.calls += 1
        if self.calls == 3:
            self.stop.set()
        raise RuntimeError("bug in the backend")


def test_the_monitor_logs_unexpected_errors_and_keeps_going(tracker, caplog):
    stop = threading.Event()
    backend = BrokenNvml(stop)
    HealthMonitor(backend, tracker, stop, interval_s=0.01).run()
    assert backend.calls == 3
    assert caplog.text.count("GPU health round failed") == 3


# ECC records.

HISTORY = EccState(0, 4, 2, False, 1, False, False)
"""A GPU that had faults before the plugin started, was reset, and is fine now."""
VOLATILE = "ECC volatileDoubleBit is 1 (double-bit errors since the driver loaded)"
GREW = "ECC aggregateDoubleBit grew from 0 to 1 since the plugin started (double-bit errors "
DOUBLE_BIT = f"{VOLATILE}; {GREW}over the GPU's life): needs a GPU reset"


def ecc_faults(kind: str) -> float:
    name = "infergrid_device_plugin_ecc_faults_total"
    return REGISTRY.get_sample_value(name, {"kind": kind}) or 0


def test_counts_from_before_the_plugin_started_leave_the_gpu_healthy(tracker):
    tracker.record_ecc(GPU, HISTORY)
    tracker.record_ecc(GPU, HISTORY)
    assert tracker.is_healthy(GPU) and tracker.version == 0


def test_a_double_bit_error_holds_the_gpu_until_the_plugin_restarts(tracker, clock):
    before = ecc_faults("needs-reset")
    tracker.record_ecc(GPU, FAKE_ECC)
    tracker.record_ecc(GPU, EccState(1, 1, 0, False, 0, False, False))
    tracker.record_ecc(GPU, EccState(1, 1, 0, False, 0, False, False))
    clock.now += 86400
    assert tracker.unhealthy() == {GPU: DOUBLE_BIT}
    assert tracker.version == 1
    assert ecc_faults("needs-reset") == before + 1


def test_a_restart_without_a_reset_still_sees_the_double_bit_error(clock):
    restarted = HealthTracker(quiet_period_s=30, clock=clock)
    restarted.record_ecc(GPU, EccState(1, 1, 0, False, 0, False, False))
    assert restarted.unhealthy() == {GPU: f"{VOLATILE}: needs a GPU reset"}


def test_a_count_that_grew_keeps_the_gpu_unhealthy_while_it_stays_above_the_first(tracker, clock):
    before = ecc_faults("grew")
    tracker.record_ecc(GPU, HISTORY)
    grown = EccState(0, 5, 2, False, 1, False, False)  # the GPU was reset since: volatile 0
    tracker.record_ecc(GPU, grown)
    reason = (
        "ECC aggregateDoubleBit grew from 4 to 5 since the plugin started "
        "(double-bit errors over the GPU's life)"
    )
    assert tracker.unhealthy() == {GPU: reason}
    for _ in range(3):
        clock.now += 20
        tracker.record_ecc(GPU, grown)
    assert not tracker.is_healthy(GPU)
    tracker.record_ecc(GPU, FAKE_ECC)  # counts cleared (nvidia-smi -p): a quiet period to go
    clock.now += 30
    assert tracker.is_healthy(GPU) and tracker.version == 2
    assert ecc_faults("grew") == before + 1


def test_a_transient_fault_that_turns_into_an_ecc_reset_is_counted(tracker, clock):
    before = ecc_faults("needs-reset")
    tracker.record_ecc(GPU, FAKE_ECC)
    tracker.record_xid(GPU, PASSING)
    tracker.record_ecc(GPU, EccState(0, 0, 0, False, 0, True, False))
    clock.now += 3600
    remap = "ECC remapPending is true (a row waits to be remapped at the next reset)"
    assert tracker.unhealthy() == {GPU: f"{remap}: needs a GPU reset"}
    assert tracker.version == 1
    assert ecc_faults("needs-reset") == before + 1


def test_an_ecc_fault_on_the_fake_nvml_is_found_by_discovery_and_published(tracker):
    fake = FakeNvml(NODES["h100"])
    assert [gpu.healthy for gpu in discover(fake, "h100", tracker).gpus] == [True, True]
    fake.inject_ecc(1, volatile_double_bit=1, aggregate_double_bit=1)
    inventory = discover(fake, "h100", tracker)
    assert [gpu.healthy for gpu in inventory.gpus] == [True, False]
    assert inventory.gpus[1].ecc == EccState(1, 1, 0, False, 0, False, False)
    assert tracker.unhealthy() == {H100[1]: DOUBLE_BIT}
