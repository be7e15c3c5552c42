"""Tiny trace files for the simulator tests, written into a test's tmp_path."""

from collections.abc import Iterable
from pathlib import Path

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec"


def write(path: Path, header: str, rows: Iterable[str]) -> Path:
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def nodes_csv(tmp_path: Path, *rows: str) -> Path:
    """``rows`` like ``n0,32000,65536,2,T4``."""
    return write(tmp_path / "nodes.csv", NODE_HEADER, rows)


def pods_csv(tmp_path: Path, *rows: str) -> Path:
    """``rows`` like ``p0,4000,8192,1,500,``."""
    return write(tmp_path / "pods.csv", POD_HEADER, rows)
