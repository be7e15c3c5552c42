"""bench/kernels_gpu.py is the one script that runs on a GPU when one is lent, often once: its
dry run (CPU, Triton's interpreter, toy shapes) goes through every section here, so a broken
section shows in CI rather than in that one GPU run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def run_bench(*args: str, cuda_visible: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if not cuda_visible:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return subprocess.run(
        [sys.executable, "-m", "bench.kernels_gpu", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def dry_run() -> dict:
    done = run_bench("--dry-run", "--json")
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def test_every_section_runs_without_error(dry_run):
    assert dry_run["errors"] == {}
    for section in ("correctness", "parity", "kernels", "tuning", "decode_step", "engine"):
        assert dry_run[section], section
    assert set(dry_run["ceilings"]) == {"copy_GBps", "bf16_matmul_TFLOPs"}


def test_every_kernel_matches_its_reference_in_every_dtype(dry_run):
    verdicts = {(row["kernel"], row["dtype"]): row["verdict"] for row in dry_run["correctness"]}
    kernels = {kernel for kernel, _ in verdicts}
    assert {"fused_add_rmsnorm", "silu_and_mul", "rotary", "kv_cache_write",
            "prefill_attention"} <= kernels  # fmt: skip
    assert {k for k in kernels if k.startswith("decode_attention/")} == {
        "decode_attention/no-split",
        "decode_attention/split-8",
        "decode_attention/heuristic",
    }
    assert len(verdicts) == 3 * len(kernels)
    assert set(verdicts.values()) == {"ok"}, verdicts


def test_the_engine_decodes_the_same_greedy_tokens_on_both_kernel_paths(dry_run):
    rows = {(row["dtype"], row["path"]): row for row in dry_run["parity"]}
    assert set(rows) == {(d, p) for d in ("fp32", "bf16") for p in ("torch", "triton")}
    for (_, path), row in rows.items():
        assert row["same"] and row["matching"] == row["tokens"], row
        assert row["graphs"] == (path == "triton"), row


def test_every_launch_variant_runs_and_agrees_with_the_reference(dry_run):
    for row in dry_run["tuning"]:
        assert row["note"] == "", row
        assert row["err"] < 3e-2, row


def test_graph_replay_gives_the_eager_result_at_every_batch(dry_run):
    for section in ("decode_step", "engine"):
        rows = [row for row in dry_run[section] if "graph_ms_value" in row]
        assert [row["batch"] for row in rows] == [1, 3], section
        for row in rows:
            assert "max|diff| 0.0e+00" in row["note"], row


def test_without_cuda_it_says_so_and_exits_2():
    done = run_bench("--sections", "ceilings", cuda_visible=False)
    assert done.returncode == 2
    assert "no CUDA device" in done.stderr


def test_an_unknown_section_is_named():
    done = run_bench("--dry-run", "--sections", "ceilings,speed")
    assert done.returncode == 2
    assert "--sections: unknown ['speed']" in done.stderr
