"""The engine on its kernels: the Triton path decodes the torch path's and transformers' tokens.

The model calls `batching_engine.kernels.dispatch` only. Forced to "triton", every kernel (norms,
rotary, KV writes, prefill and decode attention, the MLP gate) runs in Triton's interpreter on
CPU tensors (tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported). Requests of
mixed lengths go through `LLMEngine` with a small token budget, so prompts are split over steps
beside other requests' decodes.

Decode steps replayed through the runner's CUDA-graph path are checked the same way, with a
stand-in for the capture (replay recomputes from the captured buffers), as no GPU is here; and
a decode step on the Triton path is checked to read no value back to the host, which a real
capture would refuse.
"""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from batching_engine.async_engine import AsyncEngine
from batching_engine.config import EngineConfig
from batching_engine.engine import LLMEngine
from batching_engine.kernels import dispatch
from batching_engine.kernels._launch import Launch, is_interpreted
from batching_engine.kernels.rmsnorm import _fused_add_rmsnorm_kernel
from batching_engine.model.attention import decode_buffers
from batching_engine.model_runner import ModelRunner
from batching_engine.sequence import SamplingParams, Sequence
from harness.tiny_llama import LLAMA3_ROPE, hf_greedy, save_tiny_decoder, save_tiny_llama

PROMPT_LENGTHS = [3, 21, 9, 30]
MAX_TOKENS = 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-llama")
    return path, save_tiny_llama(path, rope_scaling=LLAMA3_ROPE)


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(5)
    return [torch.randint(0, 256, (n,), generator=generator).tolist() for n in PROMPT_LENGTHS]


@pytest.fixture
def backend():
    """Restore the switch after each test: it is process-wide."""
    before = dispatch.kernel_backend()
    yield dispatch.set_kernel_backend
    dispatch.set_kernel_backend(before)


def new_runner(path) -> ModelRunner:
    return ModelRunner(path, kv_cache_memory_bytes=32 * 8192, max_model_len=64, max_num_seqs=4)


def greedy(runner: ModelRunner, prompts: list[list[int]]) -> list[list[int]]:
    """Every prompt through the engine at once; 16 tokens a step splits the longer prompts."""
    config = EngineConfig(
        max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64, enable_prefix_caching=False
    )
    engine = LLMEngine(config, runner, eos_token_ids=())
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
    return engine.generate([(prompt, params) for prompt in prompts])


def test_triton_kernels_give_the_torch_paths_and_transformers_greedy_tokens(tiny, prompts, backend):
    assert is_interpreted(_fused_add_rmsnorm_kernel), "run with TRITON_INTERPRET=1 set first"
    path, reference = tiny
    backend("torch")
    torch_tokens = greedy(new_runner(path), prompts)
    backend("triton")
    triton_tokens = greedy(new_runner(path), prompts)
    expected = [hf_greedy(reference, prompt, MAX_TOKENS) for prompt in prompts]
    assert torch_tokens == expected
    assert triton_tokens == expected


@pytest.mark.parametrize("kernels", ["auto", "torch", "triton"])
def test_sliding_window_layers_decode_transformers_tokens_on_every_path(
    tmp_path, prompts, backend, kernels
):
    """A window of 6 beside full layers: every prompt but the shortest slides, in prefill
    chunks and decodes, through the C kernels (auto), the torch path and Triton's."""
    reference = save_tiny_decoder(
        tmp_path, "gemma3_text", tie_word_embeddings=False, sliding_window=6,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    backend(kernels)
    expected = [hf_greedy(reference, prompt, MAX_TOKENS) for prompt in prompts]
    assert greedy(new_runner(tmp_path), prompts) == expected


def replaying_capture(replays: list[int]):
    """Stands in for a CUDA graph: replay recomputes from the very same static buffers."""

    def capture(forward, inputs):
        output = forward(**inputs).clone()

        def replay() -> None:
            replays.append(output.shape[0])
            output.copy_(forward(**inputs))

        return replay, output

    return capture


@pytest.mark.parametrize("kernels", ["torch", "triton"])
def test_decode_steps_replayed_through_graphs_give_the_eager_tokens(
    tiny, prompts, backend, kernels
):
    path, _ = tiny
    backend(kernels)
    eager_runner = new_runner(path)
    assert eager_runner.decode_graphs is None  # graphs are captured on CUDA only
    eager = greedy(eager_runner, prompts)
    runner = new_runner(path)
    replays: list[int] = []
    assert runner.capture_decode_graphs(replaying_capture(replays))
    assert greedy(runner, prompts) == eager
    # Decode steps of 4, then of 3 or fewer as requests finish, ran on the rungs 4, 2 and 1
    # with padded rows; prefill steps ran eagerly.
    assert set(replays) <= {1, 2, 4} and 4 in replays


class HostReads(TorchDispatchMode):
    """Records every read of a tensor's values back to the host during a step: what breaks a
    CUDA-graph capture (and stalls the GPU) there. Ops reading a value (`item`, `bool(t)`,
    ops whose output size depends on values) come through torch's dispatcher; `tolist`,
    `numpy` and `cpu` do not, so they are wrapped while the mode is on."""

    VALUE_OPS = frozenset({"item", "_local_scalar_dense", "nonzero", "masked_select", "_unique2"})
    METHODS = ("tolist", "numpy", "cpu")

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []
        self._saved = {name: getattr(torch.Tensor, name) for name in self.METHODS}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.VALUE_OPS:
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, self._recording(name, method))
        return super().__enter__()

    def __exit__(self, *exc):
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, method)
        return super().__exit__(*exc)

    def _recording(self, name, method):
        def wrapper(tensor, *args, **kwargs):
            self.reads.append(f"Tensor.{name}")
            return method(tensor, *args, **kwargs)

        return wrapper


def decode_step_inputs(runner: ModelRunner) -> dict[str, torch.Tensor]:
    """Two sequences (5 and 9 tokens of context) in buffers for four, two rows padded."""
    inputs = decode_buffers(4, runner.kv_layout.blocks_needed(64), runner.device)
    inputs["input_ids"][:2] = torch.tensor([3, 7])
    inputs["positions"][:2] = torch.tensor([4, 8])
    inputs["context_lens"][:2] = torch.tensor([5, 9], dtype=torch.int32)
    inputs["block_tables"][:2, 0] = torch.tensor([0, 1], dtype=torch.int32)
    inputs["slot_mapping"][:2] = torch.tensor([4, runner.block_size + 8])
    return inputs


@pytest.mark.parametrize("kernels, reads_back", [("triton", False), ("torch", True)])
def test_a_decode_step_on_the_triton_path_reads_nothing_back_to_the_host(
    tiny, backend, kernels, reads_back
):
    """What CUDA-graph capture on a GPU needs; the torch path reads the context lengths back
    (which is why graphs are only captured on the Triton path), showing the check can fail."""
    path, _ = tiny
    backend(kernels)
    runner = new_runner(path)
    inputs = decode_step_inputs(runner)
    with torch.inference_mode(), HostReads() as probe:
        logits = runner.decode_forward(**inputs)
    assert logits.shape[0] == 4 and bool(torch.isfinite(logits).all())
    assert bool(probe.reads) == reads_back, probe.reads


def test_the_engine_worker_launches_every_kernel_with_the_models_device_current(
    tiny, prompts, backend, monkeypatch
):
    """A model on cuda:1: Triton launches on the thread's current device, which starts as 0 in
    every thread, so the engine's worker must make cuda:1 current before its first step. The
    current device is faked per thread (torch.cuda.set_device records it) and read where each
    kernel launches, in the interpreter."""
    current = threading.local()
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: setattr(current, "index", index))
    launches: list[tuple[str, int | None]] = []
    launch = Launch.run

    def recording_run(self: Launch, kernel) -> None:
        launches.append((threading.current_thread().name, getattr(current, "index", None)))
        launch(self, kernel)

    monkeypatch.setattr(Launch, "run", recording_run)
    backend("triton")
    path, reference = tiny
    config = EngineConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=64)
    engine = AsyncEngine(LLMEngine(config, new_runner(path), eos_token_ids=()), device="cuda:1")
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)

    async def generate() -> list[int]:
        engine.start()
        tokens = []
        async for delta in await engine.submit(Sequence(list(prompts[1]), params)):
            tokens += delta.token_ids
        await engine.drain()
        await engine.close()
        return tokens

    assert asyncio.run(generate()) == hf_greedy(reference, prompts[1], MAX_TOKENS)
    assert launches, "no kernel launched"
    assert set(launches) == {("engine-worker", 1)}
