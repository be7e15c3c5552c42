"""A step's host tensors reach the device in one non-blocking copy from pinned memory.

No GPU here: a dispatch mode stands in for CUDA. It sees every allocation and copy torch
makes, turns a pinned allocation into a plain one and a copy to `cuda:N` into a CPU copy,
and records both; so what the step asks of a real device is checked, and its values too.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from batching_engine.model.step_metadata import paged_metadata
from batching_engine.model_runner import ModelRunner
from batching_engine.sequence import Sequence
from batching_engine.staging import stage

CUDA = torch.device("cuda:1")


class FakeCuda(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.pinned: list[int] = []  # bytes of each pinned allocation
        self.copies: list[tuple[torch.device, bool]] = []  # (to, non_blocking) of each H2D copy

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.ops.aten.empty.memory_format and kwargs.get("pin_memory"):
            self.pinned.append(args[0][0])
            kwargs["pin_memory"] = False
        if func is torch.ops.aten._to_copy.default and kwargs.get("device") is not None:
            device = torch.device(kwargs["device"])
            if device.type == "cuda":
                self.copies.append((device, bool(kwargs.get("non_blocking"))))
                kwargs["device"] = torch.device("cpu")
        return func(*args, **kwargs)


@pytest.fixture
def fake_cuda(monkeypatch) -> FakeCuda:
    monkeypatch.setattr(torch.cuda, "_lazy_init", lambda: None)  # Tensor.to("cuda") calls it
    with FakeCuda() as mode:
        yield mode


HOST = {
    "ids": torch.arange(5),
    "tables": torch.tensor([[1, 2, -1], [3, 4, 5]], dtype=torch.int32),
    "temperature": torch.tensor([0.5, 1.5]),
    "none": torch.zeros(0, dtype=torch.int64),
}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    assert a.keys() == b.keys()
    return all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)


def test_on_the_cpu_the_tensors_are_moved_as_they_are():
    assert same(stage(HOST, torch.device("cpu")), HOST)


def test_on_cuda_they_go_in_one_non_blocking_copy_from_one_pinned_buffer(fake_cuda):
    staged = stage(HOST, CUDA)
    assert same(staged, HOST)
    assert len(fake_cuda.pinned) == 1 and fake_cuda.pinned[0] >= 40 + 24 + 8
    assert fake_cuda.copies == [(CUDA, True)]


def test_a_steps_ids_metadata_and_sampled_rows_share_the_one_copy(fake_cuda):
    """What the runner sends before a mixed step (a prefill chunk, two decodes): one pinned
    buffer, one non-blocking copy, no other host-to-device transfer."""
    runner = object.__new__(ModelRunner)
    runner.device, runner.block_size = CUDA, 4
    prompt = Sequence([5, 6, 7, 8, 9, 10], block_table=[0, 1])
    first = Sequence([1, 2, 3], output_token_ids=[4], block_table=[2], num_computed_tokens=3)
    second = Sequence([1] * 8, output_token_ids=[2], block_table=[3, 4, 5], num_computed_tokens=8)
    pairs = [(prompt, 6), (first, 1), (second, 1)]
    ids, meta, last_rows = runner._prepare(pairs, done=[0, 1, 2])
    assert fake_cuda.pinned and len(fake_cuda.pinned) == 1
    assert fake_cuda.copies == [(CUDA, True)]
    assert ids.tolist() == [5, 6, 7, 8, 9, 10, 4, 2]
    assert last_rows.tolist() == [5, 6, 7]
    expected = paged_metadata([0, 3, 8], [6, 1, 1], [[0, 1], [2], [3, 4, 5]], 4, "cpu")
    for name in ("positions", "slot_mapping", "block_tables", "context_lens", "cu_seqlens_q"):
        assert torch.equal(getattr(meta, name), getattr(expected, name)), name
        assert getattr(meta, name).dtype == getattr(expected, name).dtype, name
    assert (meta.max_query_len, meta.num_prefill_seqs, meta.num_prefill_tokens) == (6, 1, 6)
