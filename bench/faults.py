"""The fault suite under load, at a chosen load, printed as docs/operations.md's fault table.

Runs the fault tests (`e2e/test_faults_*.py`) with `INFERGRID_FAULT_LOAD` set to `--load`
and `INFERGRID_FAULT_REPORTS` to a fresh folder, where each test publishes the tally of its
fault (e2e/fault_report.py), then prints one markdown row per tally: the requests or pods
sent, how each ended, and the time to recover. It needs the local cluster with its real node
(`make cluster-up`, and the images: `make images`); like every e2e run that uses it, run it
under `flock /tmp/infergrid-e2e.lock`. A failed test still prints the tallies it published,
and the exit status is pytest's. Nothing is asserted here: the tests assert, this counts.

    .venv/bin/python -m bench.faults [--load 1] [--tests e2e/test_faults_cluster.py] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from e2e.cluster.local_cluster import REPO, LocalCluster
from e2e.fault_report import LOAD_ENV, OUTCOMES, REPORTS_ENV

COLUMNS = ("fault", "load", "sent", *OUTCOMES, "recovery s", "seen")


def fault_tests() -> list[str]:
    """Every fault test module, in a stable order."""
    return sorted(str(p.relative_to(REPO)) for p in (REPO / "e2e").glob("test_faults_*.py"))


def run_tests(tests: list[str], load: int, reports: Path, extra: list[str]) -> int:
    """pytest over `tests` at `load`, publishing into `reports`; returns pytest's status."""
    env = {**os.environ, LOAD_ENV: str(load), REPORTS_ENV: str(reports)}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests, *extra]
    return subprocess.run(argv, cwd=REPO, env=env, check=False).returncode


def collect(reports: Path) -> list[dict]:
    """The published tallies, ordered by fault name."""
    found = [json.loads(p.read_text()) for p in reports.glob("*.json")]
    return sorted(found, key=lambda r: r["fault"])


def row(report: dict) -> list[str]:
    """One tally as the table's cells; a fault with no recovery figure shows a dash."""
    recovery = report.get("recovery_s")
    outcomes = report["outcomes"]
    return [
        report["fault"],
        report["load"],
        str(report["sent"]),
        *(str(outcomes.get(o, 0)) for o in OUTCOMES),
        "-" if recovery is None else f"{recovery:.1f}",
        report.get("seen", "").replace("|", "\\|"),
    ]


def table(reports: list[dict]) -> str:
    """A markdown table of every tally; 'lost' is the column that must read 0."""
    header = [c.replace("_", " ") for c in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row(r)) + " |" for r in reports]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, default=1, help="multiplier on each test's load")
    parser.add_argument("--tests", nargs="*", help="test files or ids (default: every fault test)")
    parser.add_argument("--json", action="store_true", help="print the tallies as JSON")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args()
    if args.load < 1:
        parser.error(f"--load must be a whole number of at least 1, not {args.load}")
    if not LocalCluster().is_running():
        sys.exit("start the local cluster first: make cluster-up")
    tests = args.tests or fault_tests()
    if not tests:
        sys.exit("no fault tests found (e2e/test_faults_*.py)")
    with tempfile.TemporaryDirectory(prefix="infergrid-faults-") as folder:
        status = run_tests(tests, args.load, Path(folder), args.pytest_args)
        reports = collect(Path(folder))
    print(json.dumps(reports, indent=1) if args.json else table(reports))
    sys.exit(status)


if __name__ == "__main__":
    main()
