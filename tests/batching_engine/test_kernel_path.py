"""The engine on its kernels: the Triton path decodes the torch path's and transformers' tokens.

The model calls `batching_engine.kernels.dispatch` only. Forced to "triton", every kernel (norms,
rotary, KV writes, prefill and decode attention, the MLP gate) runs in Triton's interpreter on
CPU tensors (tests/conftest.py sets TRITON_INTERPRET=1 before triton is imported). Requests of
mixed lengths go through `LLMEngine` with a small token budget, so prompts are split over steps
beside other requests' decodes.

Decode steps replayed through the runner's CUDA-graph path are checked the same way, with a
stand-in for the capture (replay recomputes from the captured buffers), as no GPU is here.
"""

from __future__ import annotations

import pytest
import torch

from batching_engine.config import EngineConfig
from batching_engine.engine import LLMEngine
from batching_engine.kernels import dispatch
from batching_engine.kernels._launch import is_interpreted
from batching_engine.kernels.rmsnorm import _fused_add_rmsnorm_kernel
from batching_engine.model_runner import ModelRunner
from batching_engine.sequence import SamplingParams
from tests.batching_engine.tiny_llama import LLAMA3_ROPE, hf_greedy, save_tiny_llama

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
