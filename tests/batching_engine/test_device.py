"""Where the engine runs: the GPU the pod was given, else the CPU, said once."""

import pytest

from batching_engine.device import choose_device
from infergrid.errors import ContractError

POD_ENV = {"NVIDIA_VISIBLE_DEVICES": "GPU-1234"}


def test_auto_takes_the_visible_gpu_in_bfloat16():
    choice = choose_device("auto", 1, POD_ENV)
    assert (choice.device, choice.dtype, choice.is_cuda) == ("cuda", "bfloat16", True)
    assert "NVIDIA_VISIBLE_DEVICES=GPU-1234" in choice.reason


def test_auto_without_a_gpu_serves_on_the_cpu_and_says_why():
    choice = choose_device("auto", 0, POD_ENV)
    assert (choice.device, choice.dtype) == ("cpu", "float32")
    assert "no CUDA device is visible" in choice.reason and "GPU-1234" in choice.reason


def test_the_cpu_when_asked_even_with_a_gpu():
    assert choose_device("cpu", 1, POD_ENV).device == "cpu"


@pytest.mark.parametrize(("asked", "count"), [("cuda", 0), ("cuda:1", 1)])
def test_a_gpu_asked_for_but_not_visible_is_named(asked, count):
    with pytest.raises(ContractError) as err:
        choose_device(asked, count, {})
    assert err.value.field == "--device" and "visible" in err.value.reason


@pytest.mark.parametrize("asked", ["tpu", "cuda:x", "AUTO", ""])
def test_an_unknown_device_is_named(asked):
    with pytest.raises(ContractError, match="--device"):
        choose_device(asked, 0, {})
