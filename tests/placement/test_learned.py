"""The workload the extender (and the simulator, replaying as it) learns from the pods it
sees: each pod's GPUs with its CPU and GPU models, adopted only when it says something new."""

from infergrid.placement import Demand, HostRequest, LearnedWorkload, Workload
from infergrid.placement.fragmentation import WORKLOAD_WINDOW
from infergrid.placement.learned import WORKLOAD_DRIFT, WORKLOAD_REFRESH, drift, pod_demands
from tests.placement.builders import pod, share, whole

L4 = frozenset({"NVIDIA-L4"})


def test_a_pod_brings_its_cpu_once_and_its_models_to_each_gpu_container():
    request = pod(whole(2, name="a"), share(4096, 30, name="b"))
    demands = pod_demands(request, HostRequest(cpu_milli=8000, gpu_models=L4))
    assert demands == (
        Demand(whole_gpus=2, cpu_milli=8000, gpu_models=L4),
        Demand(memory_mib=4096, cores=30, gpu_models=L4),
    )


def test_the_first_pod_is_learned_at_once_with_what_it_asks_of_the_node():
    learned = LearnedWorkload()
    learned.observe("p0", pod(whole(1)), HostRequest(cpu_milli=4000))
    assert learned.workload().tasks == ((Demand(whole_gpus=1, cpu_milli=4000), 1.0),)


def test_pods_without_gpus_and_pods_seen_before_do_not_count():
    learned = LearnedWorkload()
    learned.observe("p0", pod(whole(1)))
    learned.observe("p0", pod(whole(8)))
    learned.observe("cpu", pod(), HostRequest(cpu_milli=1000))
    assert learned.workload().tasks == ((Demand(whole_gpus=1), 1.0),)


def feed(learned: LearnedWorkload, start: int, count: int, request) -> Workload:
    for at in range(start, start + count):
        learned.observe(f"p{at}", request)
    return learned.workload()


def test_a_small_wobble_keeps_the_workload_in_use_and_a_real_shift_replaces_it():
    learned = LearnedWorkload()
    first = feed(learned, 0, 400, pod(whole(1)))
    # a few different pods: the distribution moves by less than WORKLOAD_DRIFT
    wobble = int(WORKLOAD_REFRESH * 0.5)
    assert feed(learned, 400, wobble, pod(whole(2))) is first
    # people start deploying something else: it moves by more, and is adopted
    shifted = feed(learned, 400 + wobble, 400, pod(whole(2)))
    assert shifted is not first and drift(first, shifted) >= WORKLOAD_DRIFT
    assert dict(shifted.tasks)[Demand(whole_gpus=2)] > 0.5


def test_a_cluster_that_changed_is_read_at_the_next_re_read():
    shape = {"models": {"NVIDIA-L4": 8}, "cpu": 64000}
    learned = LearnedWorkload(lambda: (shape["models"], shape["cpu"]))
    before = feed(learned, 0, 100, pod(whole(1)))
    assert before.cluster_cpu_per_gpu == 8000
    shape["cpu"] = 128000
    after = feed(learned, 100, WORKLOAD_REFRESH, pod(whole(1)))
    assert after.cluster_cpu_per_gpu == 16000


def test_drift_is_the_popularity_that_moved():
    one, two = Demand(whole_gpus=1), Demand(whole_gpus=2)
    a = Workload.of([(one, 3.0), (two, 1.0)])
    b = Workload.of([(one, 1.0), (two, 1.0)])
    assert abs(drift(a, b) - 0.25) < 1e-9
    assert drift(a, a) == 0


def test_only_the_window_of_recent_pods_counts():
    learned = LearnedWorkload()
    feed(learned, 0, WORKLOAD_WINDOW, pod(whole(1)))
    assert feed(learned, WORKLOAD_WINDOW, WORKLOAD_WINDOW, pod(whole(2))).tasks == (
        (Demand(whole_gpus=2), 1.0),
    )


def test_a_deferred_re_read_waits_as_pending_and_is_in_use_once_adopted():
    """The extender's way: a shift is taken up only when it says so (``adopt``), after it
    scored the recent pod shapes under it; meanwhile pods are scored as before."""
    learned = LearnedWorkload(defer=True)
    first = feed(learned, 0, 400, pod(whole(1)))
    assert learned.pending is None  # the first workload is adopted at once: nothing to keep
    assert feed(learned, 400, 400, pod(whole(2))) is first
    shifted = learned.pending
    assert shifted is not None and dict(shifted.tasks)[Demand(whole_gpus=2)] == 0.5
    assert learned.adopt(shifted)
    assert learned.workload() is shifted and learned.pending is None


def test_a_newer_re_read_replaces_the_pending_one_which_can_no_longer_be_adopted():
    learned = LearnedWorkload(defer=True)
    first = feed(learned, 0, 400, pod(whole(1)))
    feed(learned, 400, 400, pod(whole(2)))
    older = learned.pending
    feed(learned, 800, 1000, pod(whole(4)))
    newer = learned.pending
    assert older is not None and newer is not None and newer is not older
    assert not learned.adopt(older)
    assert learned.workload() is first
    assert learned.adopt(newer) and learned.workload() is newer
