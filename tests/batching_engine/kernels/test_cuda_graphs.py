"""CUDA-graph decode: the ladder, the padding, and replay through the capture seam on CPU
(capturing a real graph needs a GPU; bench/kernels_gpu.py does that)."""

from __future__ import annotations

import pytest
import torch

from batching_engine.kernels.cuda_graphs import (
    DECODE_PAD_VALUES,
    DecodeGraphs,
    batch_size_ladder,
    fill_static,
    graph_batch_size,
)


def test_ladder_is_powers_of_two_to_eight_then_multiples_of_sixteen_up_to_the_max():
    assert batch_size_ladder(1) == [1]
    assert batch_size_ladder(8) == [1, 2, 4, 8]
    assert batch_size_ladder(40) == [1, 2, 4, 8, 16, 32, 40]
    assert batch_size_ladder(64) == [1, 2, 4, 8, 16, 32, 48, 64]


def test_a_ladder_needs_a_positive_max():
    with pytest.raises(ValueError, match="max_batch_size: must be at least 1"):
        batch_size_ladder(0)


@pytest.mark.parametrize("batch, rung", [(1, 1), (3, 4), (8, 8), (9, 16), (33, 40), (41, None)])
def test_a_batch_runs_on_the_smallest_rung_that_holds_it(batch, rung):
    assert graph_batch_size(batch_size_ladder(40), batch) == rung


def test_fill_static_pads_the_extra_rows_and_the_missing_columns():
    static = torch.zeros(4, 5, dtype=torch.int32)
    fill_static(static, torch.tensor([[7, 8], [9, 10]], dtype=torch.int32), -1, batch_size=3)
    assert static.tolist() == [
        [7, 8, -1, -1, -1],
        [9, 10, -1, -1, -1],
        [-1, -1, -1, -1, -1],
        [0, 0, 0, 0, 0],  # past the rung: untouched
    ]


def eager_capture(forward, inputs):
    """Stands in for a CUDA graph: replay recomputes from the very same buffers."""
    output = forward(**inputs).clone()
    return (lambda: output.copy_(forward(**inputs))), output


def decode_forward(input_ids, positions, slot_mapping, context_lens, block_tables):
    """A stand-in model whose output row depends on every input of its row."""
    valid = (block_tables >= 0).sum(dim=1)
    return torch.stack((input_ids * 10 + positions, slot_mapping, context_lens, valid), dim=1)


def static_buffers(max_batch: int, max_blocks: int) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.zeros(max_batch, dtype=torch.int64),
        "positions": torch.zeros(max_batch, dtype=torch.int64),
        "slot_mapping": torch.zeros(max_batch, dtype=torch.int64),
        "context_lens": torch.zeros(max_batch, dtype=torch.int32),
        "block_tables": torch.zeros(max_batch, max_blocks, dtype=torch.int32),
    }


def batch(size: int, blocks: int) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.arange(size) + 1,
        "positions": torch.arange(size) + 100,
        "slot_mapping": torch.arange(size) * 3,
        "context_lens": torch.arange(size, dtype=torch.int32) + 1,
        "block_tables": torch.ones(size, blocks, dtype=torch.int32),
    }


def graphs(capture=eager_capture) -> DecodeGraphs:
    runner = DecodeGraphs(
        decode_forward, static_buffers(8, 4), batch_size_ladder(8), capture=capture
    )
    assert runner.capture_all() is (capture is eager_capture)
    return runner


def test_replay_gives_the_eager_rows_and_pads_the_rest_to_do_nothing():
    runner = graphs()
    inputs = batch(3, blocks=2)
    out = runner.run(inputs)
    assert torch.equal(out, decode_forward(**inputs))
    padded_row = runner.graphs[4].output[3]
    assert padded_row.tolist() == [0, -1, 0, 0]  # token 0 at 0, no slot, no context, no blocks


def test_batches_past_the_ladder_or_wider_than_the_buffers_run_eagerly():
    runner = graphs()
    for inputs in (batch(9, blocks=2), batch(2, blocks=5)):
        assert torch.equal(runner.run(inputs), decode_forward(**inputs))
    assert runner.static["input_ids"].abs().sum() == 0  # the buffers were never filled


def test_a_failed_capture_leaves_every_batch_eager():
    def failing_capture(forward, inputs):
        raise RuntimeError("operation not permitted when stream is capturing")

    runner = graphs(failing_capture)
    assert runner.graphs == {}
    inputs = batch(3, blocks=2)
    assert torch.equal(runner.run(inputs), decode_forward(**inputs))


def test_an_input_of_another_dtype_than_captured_is_an_error_not_a_slow_path():
    runner = graphs()
    inputs = batch(3, blocks=2)
    inputs["slot_mapping"] = inputs["slot_mapping"].to(torch.int32)
    with pytest.raises(ValueError, match="slot_mapping: torch.int32 with 1 dims, captured as"):
        runner.run(inputs)


def test_every_input_needs_a_pad_value():
    static = static_buffers(2, 2) | {"extra": torch.zeros(2)}
    with pytest.raises(ValueError, match="no pad value for inputs \\['extra'\\]"):
        DecodeGraphs(decode_forward, static, [1, 2], DECODE_PAD_VALUES)


def test_graphs_are_off_without_a_cuda_device():
    assert not DecodeGraphs.available(torch.device("cpu"))


@pytest.mark.usefixtures("triton_interpreter")
def test_padded_rows_leave_the_cache_alone_through_the_real_kernels():
    """A padded row (slot -1, context 0, tables -1) must write no KV and attend to nothing."""
    from batching_engine.kernels.decode_attention import decode_attention_triton
    from batching_engine.kernels.kv_cache_write import write_kv_cache_triton

    k_cache, v_cache = torch.zeros(4, 8, 2, 16), torch.zeros(4, 8, 2, 16)
    new_kv = torch.randn(4, 2, 16, generator=torch.Generator().manual_seed(0))

    def forward(input_ids, positions, slot_mapping, context_lens, block_tables):
        rows = input_ids.shape[0]
        write_kv_cache_triton(new_kv[:rows], new_kv[:rows], k_cache, v_cache, slot_mapping)
        q = new_kv[:rows].repeat(1, 2, 1)  # 4 query heads, 2 per kv head
        return decode_attention_triton(q, k_cache, v_cache, block_tables, context_lens)

    runner = DecodeGraphs(forward, static_buffers(4, 2), [4], capture=eager_capture)
    assert runner.capture_all()
    assert k_cache.abs().sum() == 0  # capturing ran on padding rows only
    inputs = batch(3, blocks=2) | {"block_tables": torch.tensor([[0, 1], [2, -1], [3, -1]],
                                                              dtype=torch.int32)}  # fmt: skip
    inputs["slot_mapping"] = torch.tensor([0, 16, 24])
    inputs["context_lens"] = torch.tensor([1, 1, 1], dtype=torch.int32)
    out = runner.run(inputs)
    written = k_cache.flatten(0, 1).abs().sum(dim=(1, 2)) > 0
    assert written.nonzero().flatten().tolist() == [0, 16, 24]
    assert torch.equal(runner.graphs[4].output[3], torch.zeros(4, 16))
    # one key each: every head gets its kv head's value
    torch.testing.assert_close(out, new_kv[:3].repeat_interleave(2, dim=1))
