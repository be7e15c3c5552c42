"""The one part of the engine that owns the model and the device.

`execute` takes the scheduler's `(sequence, num_new_tokens)` pairs, runs all their chunks as one
flat batch through the model (writing their KV into the paged cache), and samples a token only
for the chunks that reach the end of their sequence. It never changes a sequence: the engine
advances them afterwards. `embed` and `classify` serve single-pass models (a Llama decoder or a
BERT encoder), with no cache; `embed` pools as the model's own sentence-transformers files say.

The KV cache is sized once, at start, to what the memory budget leaves: on a GPU the budget
covers weights, the activation peak (measured with a worst-case dummy step), the memory pool of
the decode CUDA graphs, what this process then holds outside torch's allocator (CUDA context,
cuBLAS, Triton modules; never a neighbour's memory, see own_memory.py) and the cache; on a CPU
the caller gives the cache size directly. A device with less free memory than the budget still
needs is refused, not served by a smaller engine.

On CUDA (where dispatch takes the Triton path, which never syncs with the host) decode-only
steps replay CUDA graphs captured at a ladder of batch sizes; prefill steps, batches past the
ladder and any device where capture is unavailable or failed run eagerly, with the same results.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence as Seq
from pathlib import Path
from typing import Any, ClassVar

import torch

from batching_engine.device import use_device
from batching_engine.kernels.cuda_graphs import Capture, DecodeGraphs, batch_size_ladder
from batching_engine.memory_meter import SYSTEM_NVML, MemoryMeter
from batching_engine.model.activation_profile import ActivationPeaks, activation_peaks
from batching_engine.model.attention import (
    PagedAttentionMetadata,
    decode_buffers,
    decode_metadata,
)
from batching_engine.model.bert import BertForSequenceClassification, BertModel
from batching_engine.model.config import ModelConfig
from batching_engine.model.heads import (
    POOLING_MODES,
    LlamaForSequenceClassification,
    pool_embeddings,
)
from batching_engine.model.kv_cache import KVCacheLayout, KVCaches
from batching_engine.model.layers import pack_linears
from batching_engine.model.llama import LlamaModel
from batching_engine.model.loader import load_model
from batching_engine.model.pooling import read_pooling
from batching_engine.model.step_metadata import dense_metadata, paged_step_metadata
from batching_engine.model.tensor_parallel import (
    SINGLE,
    Followers,
    TensorParallel,
    receive_step,
    send_step,
)
from batching_engine.own_memory import DeviceMemory, OwnMemory, check_device_room
from batching_engine.sampler import sample
from batching_engine.sequence import Sequence
from infergrid.errors import ContractError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
MIB = 1 << 20
CLASSIFIERS = (LlamaForSequenceClassification, BertForSequenceClassification)
log = logging.getLogger("infergrid.engine")


class ModelRunner:
    """Model, KV cache and sampling for one engine; `num_kv_blocks` is what the cache holds."""

    # Where the budget reads the device's memory on CUDA: torch.cuda and NVML for this process,
    # or a simulated GPU's client (harness/simulated_gpu.py).
    cuda_memory: ClassVar[Any] = torch.cuda
    nvml_memory: ClassVar[Any] = SYSTEM_NVML

    def __init__(
        self,
        model_dir: str | Path,
        *,
        device: str = "cpu",
        dtype: torch.dtype | str = torch.float32,
        kv_cache_dtype: torch.dtype | str | None = None,  # None: the model's dtype
        block_size: int = 16,
        kv_cache_memory_bytes: int | None = None,
        memory_budget_bytes: int | None = None,
        max_model_len: int | None = None,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 4096,
        quantization: str = "none",
        tp: TensorParallel = SINGLE,
        workers: Followers | None = None,
    ) -> None:
        self.device = torch.device(device)
        self.memory_meter = self._open_memory_meter()  # before this process's CUDA context
        use_device(self.device)  # this thread builds the model, profiles it, captures graphs
        self.dtype = _dtype(dtype)
        self.block_size = block_size
        self.workers = workers  # rank 0 of a tensor-parallel engine: the other ranks
        tp = workers.tp if workers is not None else tp
        self.tp = tp
        self.config, self.model = load_model(
            model_dir, dtype=self.dtype, device=device, quantization=quantization, tp=tp
        )
        self.pooling = read_pooling(model_dir)
        pack_linears(self.model, max_num_seqs)  # CPU float32 only: the decode batch's rows
        self.max_model_len = _max_model_len(self.config, max_model_len)
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        kv_dtype = _dtype(kv_cache_dtype) if kv_cache_dtype is not None else self.dtype
        self.kv_layout = KVCacheLayout.for_model(self.config, block_size, kv_dtype, tp)
        self.kv_caches: KVCaches = []
        self.num_kv_blocks = 0
        self.kv_cache_commits_lazily = self.device.type == "cpu"  # see `KVCacheLayout.allocate`
        self.decode_graphs: DecodeGraphs | None = None
        if self.config.head == "lm_head":
            graphs = DecodeGraphs.available(self.device) and tp.size == 1
            kv_bytes = self._kv_cache_bytes(kv_cache_memory_bytes, memory_budget_bytes, graphs)
            # Block tables are shared, so every rank holds as many blocks as the smallest can.
            self.num_kv_blocks = tp.min(self.kv_layout.num_blocks(kv_bytes, self.max_model_len))
            self.kv_caches = self.kv_layout.allocate(self.num_kv_blocks, self.device)
            if graphs:
                self.capture_decode_graphs()

    @property
    def weight_bytes(self) -> int:
        """Parameters and buffers (packed weights are buffers, as are the rotary tables)."""
        tensors = [*self.model.parameters(), *self.model.buffers()]
        return sum(t.numel() * t.element_size() for t in tensors)

    @torch.inference_mode()
    def execute(self, batch: list[tuple[Sequence, int]]) -> list[int | None]:
        """KV for every chunk; a sampled token for each chunk that completes its sequence."""
        if not batch:
            return []
        order = _batch_order(batch)
        pairs = [batch[i] for i in order]
        done = [i for i, (s, n) in enumerate(pairs) if s.num_computed_tokens + n == s.num_tokens]
        input_ids, meta, last_rows = self._prepare(pairs, done)
        hidden = self._forward(input_ids, meta)
        tokens: list[int | None] = [None] * len(batch)
        for i, token in self._sample_completed(pairs, done, hidden, last_rows).items():
            tokens[order[i]] = token
        return tokens

    @torch.inference_mode()
    def capture_decode_graphs(self, capture: Capture | None = None) -> bool:
        """Capture decode steps at every batch size of the ladder; False (and eager decode
        from then on) when a capture fails. `capture` replaces the real CUDA-graph capture,
        which is how the replay path is tested without a GPU."""
        max_blocks = self.kv_layout.blocks_needed(self.max_model_len)
        graphs = DecodeGraphs(
            self.decode_forward,
            decode_buffers(self.max_num_seqs, max_blocks, self.device),
            batch_size_ladder(self.max_num_seqs),
            capture=capture,
        )
        self.decode_graphs = graphs if graphs.capture_all() else None
        return self.decode_graphs is not None

    def decode_forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slot_mapping: torch.Tensor,
        context_lens: torch.Tensor,
        block_tables: torch.Tensor,
    ) -> torch.Tensor:
        """A decode-only step from tensors alone (one token per sequence): what a graph holds."""
        meta = decode_metadata(positions, slot_mapping, context_lens, block_tables)
        return self.model(input_ids, meta, self.kv_caches)

    @torch.inference_mode()
    def embed(self, token_ids: Seq[Seq[int]], pooling: str | None = None) -> torch.Tensor:
        """Embeddings, [num_inputs, hidden] float32 on the CPU, pooled by `pooling` or else as
        the model says (`self.pooling`), L2-normalised unless the model says otherwise."""
        mode = pooling or self.pooling.mode
        if mode not in POOLING_MODES:
            raise ContractError("pooling", f"{mode!r} is not one of {', '.join(POOLING_MODES)}")
        hidden, lens = self._single_pass(token_ids)
        return pool_embeddings(hidden, lens, mode, normalize=self.pooling.normalize).cpu()

    @torch.inference_mode()
    def classify(self, token_ids: Seq[Seq[int]]) -> torch.Tensor:
        """Class logits, [num_inputs, num_labels] float32 on the CPU."""
        if not isinstance(self.model, CLASSIFIERS):
            raise ContractError(
                "model.task", f"{self.config.architecture} has no classification head"
            )
        hidden, lens = self._single_pass(token_ids)
        return self.model.classify(hidden, lens).cpu()

    def _prepare(
        self, pairs: list[tuple[Sequence, int]], done: list[int]
    ) -> tuple[torch.Tensor, PagedAttentionMetadata, torch.Tensor]:
        """The chunks' token ids, flattened, where each token sits in the cache, and the rows
        of the `done` chunks' last tokens: on the device in one non-blocking copy."""
        starts, lens, tables, ids = [], [], [], []
        for seq, n in pairs:
            start = seq.num_computed_tokens
            assert n >= 1 and start + n <= seq.num_tokens, f"bad chunk for sequence {seq.seq_id}"
            assert len(seq.block_table) * self.block_size >= start + n, "block table too short"
            ids.extend(_chunk(seq, start, n))
            starts.append(start)
            lens.append(n)
            tables.append(seq.block_table)
        ends = list(itertools.accumulate(lens))
        extra = {
            "input_ids": torch.tensor(ids, dtype=torch.int64),
            "last_rows": torch.tensor([ends[i] - 1 for i in done], dtype=torch.int64),
        }
        meta, on_device = paged_step_metadata(
            starts, lens, tables, self.block_size, self.device, extra
        )
        return on_device["input_ids"], meta, on_device["last_rows"]

    @torch.inference_mode()
    def follow(self) -> None:
        """Ranks other than 0: run each step rank 0 sends, in lockstep with it, until it sends
        the stop (`stop_followers`)."""
        while (step := receive_step(self.tp, self.device)) is not None:
            self.model(*step, self.kv_caches)

    def stop_followers(self) -> None:
        """Rank 0: end the other ranks' `follow`."""
        send_step(self.tp, None)

    def close(self) -> None:
        """Stop the tensor-parallel workers, if any (after the last step)."""
        if self.workers is None:
            return
        if self.workers.failed is None:
            self.stop_followers()
        self.workers.close()

    def _forward(self, input_ids: torch.Tensor, meta: PagedAttentionMetadata) -> torch.Tensor:
        """Hidden states of every token: decode-only steps through a graph when one fits."""
        send_step(self.tp, (input_ids, meta))
        if self.decode_graphs is None or meta.num_prefill_seqs:
            return self.model(input_ids, meta, self.kv_caches)
        inputs = {"input_ids": input_ids, "positions": meta.positions,
                  "slot_mapping": meta.slot_mapping, "context_lens": meta.context_lens,
                  "block_tables": meta.block_tables}  # fmt: skip
        return self.decode_graphs.run(inputs)

    def _sample_completed(
        self,
        pairs: list[tuple[Sequence, int]],
        done: list[int],
        hidden: torch.Tensor,
        last_rows: torch.Tensor,
    ) -> dict[int, int]:
        """Tokens for the pairs whose chunk ends their sequence; logits only for those rows."""
        if not done:
            return {}
        logits = self.model.compute_logits(hidden.index_select(0, last_rows))
        params = [pairs[i][0].params for i in done]
        steps = [len(pairs[i][0].output_token_ids) for i in done]
        return dict(zip(done, sample(logits, params, steps), strict=True))

    def _single_pass(self, token_ids: Seq[Seq[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed hidden states of whole inputs in one flat batch, and the inputs' lengths."""
        lens = [self._check_input(ids, f"input[{i}]") for i, ids in enumerate(token_ids)]
        if not lens:
            raise ContractError("input", "must hold at least one input")
        flat = torch.tensor([t for ids in token_ids for t in ids], device=self.device)
        trunk = self.model if isinstance(self.model, LlamaModel | BertModel) else self.model.model
        hidden = trunk(flat, dense_metadata(lens, self.device))
        return hidden, torch.tensor(lens, device=self.device)

    def _check_input(self, ids: Seq[int], field: str) -> int:
        if not 0 < len(ids) <= self.max_model_len:
            raise ContractError(field, f"needs 1 to {self.max_model_len} tokens, got {len(ids)}")
        vocab = self.config.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise ContractError(field, f"token id {bad} is outside the vocabulary (0..{vocab - 1})")
        return len(ids)

    def _open_memory_meter(self) -> MemoryMeter | None:
        if self.device.type != "cuda":
            return None
        return MemoryMeter(self.device.index or 0, self.cuda_memory, self.nvml_memory)

    def _kv_cache_bytes(self, kv_bytes: int | None, budget_bytes: int | None, graphs: bool) -> int:
        """The cache's size: given directly, or what the budget leaves after weights and (on a
        GPU) the measured activation peak, plus a decode step's worth kept by the graphs' pool,
        and what this process then holds outside torch (CUDA context, cuBLAS, Triton)."""
        if budget_bytes is None:
            if kv_bytes is None:
                raise ContractError("kv_cache_memory_bytes", "set it, or memory_budget_bytes")
            return kv_bytes
        activations, measured = self._gpu_overheads(graphs) if self.memory_meter else (0, None)
        outside = measured[1].outside_torch if measured else 0
        free = budget_bytes - outside - self.weight_bytes - activations
        if free <= 0 or (kv_bytes is not None and kv_bytes > free):
            raise ContractError(
                "memory_budget_bytes",
                f"{budget_bytes // MIB} MiB cannot hold weights ({self.weight_bytes // MIB} MiB)"
                f" + activations ({activations // MIB} MiB)"
                + (f" + memory outside torch ({outside // MIB} MiB)" if outside else "")
                + (f" + the KV cache asked for ({kv_bytes // MIB} MiB)" if kv_bytes else ""),
            )
        kv = kv_bytes if kv_bytes is not None else free
        if measured is not None:
            check_device_room(budget_bytes, self.weight_bytes + activations + kv, *measured)
            log.info("memory plan: budget %d MiB = weights %d + activations %d + outside torch"
                     " %d + KV cache %d MiB", budget_bytes // MIB, self.weight_bytes // MIB,
                     activations // MIB, outside // MIB, kv // MIB)  # fmt: skip
        return kv

    def _gpu_overheads(self, graphs: bool) -> tuple[int, tuple[DeviceMemory, OwnMemory]]:
        """The activation peak (with the graphs' pool), then what the device and this process
        hold: measured after the profile, which loads the step's kernels and cuBLAS."""
        peaks = self._activation_peaks()
        memory, own = self.memory_meter.measure(self.device)
        say = log.warning if own.neighbours_included else log.info
        say("memory outside torch: %d MiB (%s)", own.outside_torch // MIB, own.method)
        return peaks.step + (peaks.decode_forward if graphs else 0), (memory, own)

    def _activation_peaks(self) -> ActivationPeaks:
        return activation_peaks(
            self.model,
            self.kv_layout,
            self.device,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )


def _batch_order(batch: list[tuple[Sequence, int]]) -> list[int]:
    """Prefill chunks first (attention takes them apart from decodes), then decodes by
    context length, so the torch path's groups of similar length are adjacent rows."""
    return sorted(
        range(len(batch)), key=lambda i: (batch[i][1] == 1, batch[i][0].num_computed_tokens)
    )


def _chunk(seq: Sequence, start: int, n: int) -> list[int]:
    """token_ids[start:start + n] without building the whole prompt + output list."""
    prompt = seq.prompt_token_ids
    if start >= len(prompt):
        return seq.output_token_ids[start - len(prompt) : start - len(prompt) + n]
    if start + n <= len(prompt):
        return prompt[start : start + n]
    return prompt[start:] + seq.output_token_ids[: start + n - len(prompt)]


def _dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ContractError("dtype", f"{dtype!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _max_model_len(config: ModelConfig, asked: int | None) -> int:
    if asked is None:
        return config.max_position_embeddings
    if not 0 < asked <= config.max_position_embeddings:
        raise ContractError(
            "max_model_len",
            f"must be 1 to the model's max_position_embeddings ({config.max_position_embeddings}),"
            f" got {asked}",
        )
    return asked
