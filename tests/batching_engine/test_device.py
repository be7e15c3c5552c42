"""Where the engine runs: the GPU the pod was given, else the CPU, said once."""

from types import SimpleNamespace

import pytest
import torch

from batching_engine import loading, model_runner
from batching_engine.config import EngineConfig
from batching_engine.device import choose_device, use_device
from batching_engine.model_runner import ModelRunner
from batching_engine.own_memory import NvmlReading
from infergrid.errors import ContractError

GIB = 1 << 30
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


def test_use_device_makes_a_cuda_device_current_and_leaves_the_cpu_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    for device in ("cuda:1", torch.device("cuda:2"), "cuda", "cpu", None):
        use_device(device)
    assert calls == [1, 2, 0]


def test_the_loader_hands_the_runner_the_chosen_gpu_and_its_budget(monkeypatch):
    """--device cuda:1 on a 1 GiB card: the runner gets cuda:1 and the card times the
    utilisation (the runner makes cuda:1 current itself, once its memory meter is open)."""
    built = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=GIB)
    )

    def runner(model_dir, *, device, memory_budget_bytes, **kwargs):
        built.append((device, memory_budget_bytes, kwargs["kv_cache_dtype"]))
        return SimpleNamespace(device=torch.device(device))

    monkeypatch.setattr(loading, "ModelRunner", runner)
    settings = SimpleNamespace(
        device="cuda:1", dtype=None, kv_cache_memory=None, kv_cache_dtype="auto"
    )
    engine_config = EngineConfig(
        block_size=16,
        max_model_len=64,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        quantization="none",
    )
    loading._runner(settings, "model", engine_config, print)
    assert built == [("cuda:1", int(GIB * 0.9), "bfloat16")]


class Built(Exception):
    """Stops the runner once it starts building the model."""


def test_the_runner_makes_its_gpu_current_before_it_builds_the_model(monkeypatch):
    """The runner (weights, activation profile, CUDA-graph capture) is built on the loader
    thread, whose current device is 0 until set: with --device cuda:1 it must be 1 first, and
    only after NVML's baseline of the device is read (before the process's CUDA context)."""
    events = []

    def load_model(model_dir, **kwargs):
        events.append(("build", kwargs["device"]))
        raise Built

    def nvml_read(cuda_index):
        events.append(("baseline", cuda_index))
        return NvmlReading(card_total=GIB, is_mig=False, used=0, processes={})

    nvml = SimpleNamespace(pid=1, environ={}, read=nvml_read)
    monkeypatch.setattr(ModelRunner, "nvml_memory", nvml)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: events.append(("current", index)))
    monkeypatch.setattr(model_runner, "load_model", load_model)
    with pytest.raises(Built):
        ModelRunner("model", device="cuda:1")
    assert events == [("baseline", 1), ("current", 1), ("build", "cuda:1")]
