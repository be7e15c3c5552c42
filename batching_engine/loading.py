"""From settings to a loaded model: files, memory budget, runner, tokenizer and engine.

Runs on a thread while the server already answers probes (it can take a while: a GGUF file
is converted the first time it is seen). Every mistake a person can fix, a model that
cannot do the task or a budget the model does not fit, raises a ContractError naming the
setting.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from batching_engine.async_engine import AsyncEngine
from batching_engine.config import EngineConfig, Settings
from batching_engine.device import DeviceChoice, choose_device
from batching_engine.engine import LLMEngine
from batching_engine.kernels import dispatch
from batching_engine.memory_budget import resolve_memory_budget
from batching_engine.metrics import EngineMetrics
from batching_engine.model.config import ModelConfig, model_config_from_dir
from batching_engine.model.kv_cache import kv_cache_dtype
from batching_engine.model.quantization import resolve_quantization
from batching_engine.model_runner import ModelRunner
from batching_engine.model_source import resolve_model_dir
from batching_engine.server.served_model import GENERATION_TASK, ServedModel
from batching_engine.tokenizer import Tokenizer
from batching_engine.tp_workers import TPWorkers
from infergrid.errors import ContractError
from infergrid.serving_config import BY_ATTR

log = logging.getLogger("infergrid.engine")


def load(
    settings: Settings,
    metrics: EngineMetrics,
    on_failure: Callable[[str], None] = lambda reason: None,
) -> tuple[ServedModel, AsyncEngine]:
    """`on_failure` hears, from another thread, that the engine can no longer serve: a
    tensor-parallel worker died."""
    started = time.monotonic()
    _set_cpu_threads(settings.cpu_threads)
    model_dir = resolve_model_dir(settings.model_uri, allow_download=settings.allow_download)
    model_config = model_config_from_dir(model_dir)
    _check_task(settings.task, model_config)
    engine_config = _fit_model_len(settings, model_config)
    runner = _runner(settings, model_dir, engine_config, on_failure)
    tokenizer = Tokenizer(model_dir)
    engine = None
    if settings.task == GENERATION_TASK:
        eos = tokenizer.eos_token_ids | set(model_config.eos_token_ids)
        engine = LLMEngine(engine_config, runner, eos, tokenizer.detokenizer)
    served = ServedModel(
        name=settings.model_name,
        task=settings.task,
        tokenizer=tokenizer,
        runner=runner,
        vocab_size=model_config.vocab_size,
        max_model_len=engine_config.max_model_len,
        created=int(time.time()),
    )
    log.info(
        "loaded %s from %s in %.1f s: %d KV blocks of %d tokens",
        settings.model_name,
        model_dir,
        time.monotonic() - started,
        runner.num_kv_blocks,
        engine_config.block_size,
    )
    _return_freed_heap()
    return served, AsyncEngine(engine, metrics, device=runner.device)


def _return_freed_heap() -> None:
    """Give back to the system the heap that loading freed. Converting and quantizing the
    weights goes through large temporaries, and glibc keeps freed heap mapped, so the process
    would hold its peak for good: SmolLM2's Q4_1 on the CPU held 100 MiB more resident
    without this. A C library without `malloc_trim` (musl) has nothing to trim."""
    library = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(library), "malloc_trim", None) if library else None
    if trim is not None:
        trim(0)


def _set_cpu_threads(asked: int | None) -> None:
    """Every usable CPU by default, measured on 2 CPUs against one thread (leaving a CPU to
    the event loop), SmolLM2 over HTTP: 1.27x the tokens/s one request at a time and 1.29x
    with 64 in flight (bench/engine_vs_llamacpp.py --engine-args "--cpu-threads 1"), and
    0.92x the completions/s under a storm of 429s (bench/engine_overload.py), where the
    event loop is the bottleneck and OpenMP threads waiting for each other take its CPU."""
    threads = asked or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    log.info("torch uses %d CPU threads", threads)


def _check_task(task: str, config: ModelConfig) -> None:
    if task == GENERATION_TASK and config.head != "lm_head":
        raise ContractError(
            "model.task",
            f"{config.architecture} has no language-model head; it cannot do text-generation",
        )


def _fit_model_len(settings: Settings, config: ModelConfig) -> EngineConfig:
    """max_model_len is at most what the model's positions allow; the default shrinks to fit."""
    asked, limit = settings.engine.max_model_len, config.max_position_embeddings
    if asked <= limit:
        return settings.engine
    log.warning("max_model_len %d exceeds the model's %d positions; using %d", asked, limit, limit)
    return replace(settings.engine, max_model_len=limit)


def _runner(
    settings: Settings,
    model_dir: Path,
    engine_config: EngineConfig,
    on_failure: Callable[[str], None],
) -> ModelRunner:
    cuda_devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    choice = choose_device(settings.device, cuda_devices, os.environ)
    device, total = choice.device, None
    size = tensor_parallel_size(engine_config.tensor_parallel_size, choice, cuda_devices)
    if size > 1 and choice.is_cuda:
        device = "cuda:0"  # rank r serves on cuda:r
    if choice.is_cuda:
        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    log.info("device %s (%s): %s", device, settings.dtype or choice.dtype, choice.reason)
    engine_config = engine_config.for_device(torch.device(device).type)
    budget = resolve_memory_budget(
        device=device,
        environ=os.environ,
        gpu_memory_utilization=engine_config.gpu_memory_utilization,
        kv_cache_memory=settings.kv_cache_memory,
        device_total_bytes=total,
    )
    log.info("memory budget from %s", budget.source)
    quantization, why = resolve_quantization(
        engine_config.quantization, model_dir, torch.device(device)
    )
    log.info("weights: %s (%s)", quantization, why)
    dtype = settings.dtype or choice.dtype
    kv_dtype = served_kv_cache_dtype(settings.kv_cache_dtype, device, dtype)
    log.info("KV cache in %s (--kv-cache-dtype %s)", kv_dtype, settings.kv_cache_dtype)
    kwargs = {
        "model_dir": model_dir,
        "device": device,
        "dtype": dtype,
        "kv_cache_dtype": kv_dtype,
        "block_size": engine_config.block_size,
        "kv_cache_memory_bytes": budget.kv_cache_bytes,
        "memory_budget_bytes": budget.total_bytes,
        "max_model_len": engine_config.max_model_len,
        "max_num_seqs": engine_config.max_num_seqs,
        "max_num_batched_tokens": engine_config.max_num_batched_tokens,
        "quantization": quantization,
    }
    if size == 1:
        return ModelRunner(**kwargs)
    log.info("tensor parallelism: %d ranks", size)
    workers = TPWorkers(size, kwargs, on_failure=on_failure, cpu_threads=torch.get_num_threads())
    try:
        return ModelRunner(**kwargs, workers=workers)
    except BaseException:
        workers.close()
        raise


def served_kv_cache_dtype(asked: str, device: str, dtype: str) -> str:
    """The KV cache's dtype: as asked, or for `auto` `kv_cache_dtype`'s choice for the device
    (float16 for a float32 model on the CPU, unless Triton's kernels are forced there)."""
    if asked != "auto":
        return asked
    triton = dispatch.kernel_backend() == "triton"
    chosen = kv_cache_dtype(torch.device(device), getattr(torch, dtype), triton)
    return str(chosen).removeprefix("torch.")


def tensor_parallel_size(asked: int, choice: DeviceChoice, cuda_devices: int) -> int:
    """The ranks to run: as asked, or (0) one per visible GPU (1 on the CPU, or on the one GPU
    `--device cuda:N` names). On GPUs each rank needs its own, so more ranks than visible GPUs
    is refused."""
    if asked == 0:
        return cuda_devices if choice.device == "cuda" else 1
    if choice.is_cuda and asked > cuda_devices:
        raise ContractError(
            BY_ATTR["tensor_parallel_size"].flag,
            f"{asked} ranks need {asked} GPUs; {cuda_devices} are visible",
        )
    return asked
