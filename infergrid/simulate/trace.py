"""Reading the openb trace: a node list and a pod list, as CSV.

Columns (the trace README in ``shared/traces/openb`` defines them):

* nodes: ``sn,cpu_milli,memory_mib,gpu,model``;
* pods: ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` and, optionally,
  ``gpu_spec`` (allowed models separated by ``|``; empty allows any). Other
  columns (qos, phase, timestamps) are read past: the replay uses none of them.

A bad file fails with a ContractError naming the file, line and column.
"""

import csv
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from infergrid.errors import ContractError

NODE_COLUMNS: Final = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS: Final = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
GPU_SPEC_COLUMN: Final = "gpu_spec"
MILLI_GPU: Final = 1000
_SPEC_SEPARATOR: Final = "|"


@dataclass(frozen=True, slots=True)
class TraceNode:
    """One node of the trace: CPU millicores, memory MiB, and ``gpus`` GPUs of ``model``."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod: CPU and memory, ``num_gpu`` GPUs of ``gpu_milli`` thousandths each, and the
    GPU models it accepts (empty: any)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: frozenset[str] = frozenset()

    @property
    def gpu_request_milli(self) -> int:
        """The pod's whole GPU request in milli-GPUs: num_gpu × gpu_milli."""
        return self.num_gpu * self.gpu_milli

    @property
    def shape(self) -> tuple[int, int, int, int, frozenset[str]]:
        """What placement reads of the pod; pods of one shape place alike."""
        return (self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli, self.gpu_spec)


class _Row:
    """One CSV row, with what errors about it need: the file, the line and the header."""

    def __init__(self, path: str, line: int, values: dict[str, str]) -> None:
        self.path = path
        self.line = line
        self.values = values

    def error(self, column: str, reason: str) -> ContractError:
        return ContractError(f"{self.path}:{self.line}: {column}", reason)

    def text(self, column: str, required: bool = True) -> str:
        value = self.values.get(column, "").strip()
        if required and not value:
            raise self.error(column, "is empty")
        return value

    def number(self, column: str, low: int = 0, high: int | None = None) -> int:
        raw = self.text(column)
        try:
            value = int(raw)
        except ValueError:
            raise self.error(column, f"{raw!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            bounds = f"from {low} to {high}" if high is not None else f"at least {low}"
            raise self.error(column, f"{value} is out of range: must be {bounds}")
        return value


def _rows(path: str | Path, columns: tuple[str, ...]) -> Iterator[_Row]:
    name = str(path)
    try:
        handle = open(path, newline="", encoding="utf-8")  # noqa: SIM115
    except OSError as error:
        raise ContractError(name, f"cannot read: {error.strerror or error}") from None
    with handle:
        reader = csv.reader(handle)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration:
            raise ContractError(f"{name}:1", "empty file: no header") from None
        except (csv.Error, UnicodeDecodeError) as error:
            raise ContractError(f"{name}:1", f"not CSV: {error}") from None
        missing = [c for c in columns if c not in header]
        if missing:
            raise ContractError(
                f"{name}:1: {missing[0]}", f"missing column; the header has {', '.join(header)}"
            )
        line = 1
        try:
            for record in reader:
                line = reader.line_num
                if not any(cell.strip() for cell in record):
                    continue
                if len(record) != len(header):
                    raise ContractError(
                        f"{name}:{line}", f"{len(record)} fields, the header has {len(header)}"
                    )
                yield _Row(name, line, dict(zip(header, record, strict=True)))
        except (csv.Error, UnicodeDecodeError) as error:
            raise ContractError(f"{name}:{line + 1}", f"not CSV: {error}") from None


def load_nodes(path: str | Path) -> tuple[TraceNode, ...]:
    """Every node of a node-list CSV; names must be unique, and a node with GPUs names a model."""
    nodes: list[TraceNode] = []
    seen: dict[str, int] = {}
    for row in _rows(path, NODE_COLUMNS):
        name = row.text("sn")
        if name in seen:
            raise row.error("sn", f"{name!r} is also on line {seen[name]}")
        seen[name] = row.line
        gpus = row.number("gpu")
        model = row.text("model", required=gpus > 0)
        nodes.append(
            TraceNode(name, row.number("cpu_milli"), row.number("memory_mib"), gpus, model)
        )
    if not nodes:
        raise ContractError(str(path), "no nodes")
    return tuple(nodes)


def load_pods(path: str | Path) -> tuple[TracePod, ...]:
    """Every pod of a pod-list CSV, checked: a GPU pod asks 1–1000 milli per GPU, and a share
    (under 1000) is of one GPU."""
    pods: list[TracePod] = []
    seen: dict[str, int] = {}
    for row in _rows(path, POD_COLUMNS):
        name = row.text("name")
        if name in seen:
            raise row.error("name", f"{name!r} is also on line {seen[name]}")
        seen[name] = row.line
        num_gpu = row.number("num_gpu")
        gpu_milli = row.number("gpu_milli", high=MILLI_GPU)
        if num_gpu and not gpu_milli:
            raise row.error("gpu_milli", f"is 0, but the pod asks for {num_gpu} GPU(s)")
        if gpu_milli and not num_gpu:
            raise row.error("num_gpu", f"is 0, but gpu_milli is {gpu_milli}")
        if 0 < gpu_milli < MILLI_GPU and num_gpu > 1:
            reason = f"is {num_gpu}, but a share ({gpu_milli} milli) is of one GPU"
            raise row.error("num_gpu", reason)
        spec = row.text(GPU_SPEC_COLUMN, required=False)
        models = frozenset(m.strip() for m in spec.split(_SPEC_SEPARATOR) if m.strip())
        pods.append(
            TracePod(
                name,
                row.number("cpu_milli"),
                row.number("memory_mib"),
                num_gpu,
                gpu_milli,
                models,
            )
        )
    if not pods:
        raise ContractError(str(path), "no pods")
    return tuple(pods)
