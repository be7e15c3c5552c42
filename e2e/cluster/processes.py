"""Starting, checking and stopping the control plane's processes.

Each process runs in its own session with its pid and argv recorded in the
state folder, so `down` from another shell stops exactly what `up` started and
never a process that merely reused a pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


class ClusterError(RuntimeError):
    """The local cluster could not be brought up; the message says which part and why."""


def wait_until(check: Callable[[], bool], timeout: float, what: str, on_poll=None) -> None:
    """Polls `check` until it holds; `on_poll` may raise to fail early (a crashed process)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if on_poll:
            on_poll()
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not ready yet; the deadline decides
            pass
        time.sleep(0.2)
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")


def log_tail(path: Path, lines: int = 20) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class ProcessTable:
    """The processes of one cluster, recorded under `state/pids`."""

    def __init__(self, state: Path):
        self.pids = state / "pids"
        self.logs = state / "logs"
        self._children: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> int:
        self.pids.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env=env,
            )
        (self.pids / f"{name}.json").write_text(json.dumps({"pid": proc.pid, "argv": argv}))
        self._children[name] = proc
        return proc.pid

    def alive(self, name: str) -> bool:
        """Our own children are polled: /proc shows no argv for a moment after exec."""
        if name in self._children:
            return self._children[name].poll() is None
        record = self._record(name)
        return record is not None and is_ours(record["pid"], record["argv"][0])

    def records(self) -> dict[str, tuple[int, str]]:
        """Name to (pid, binary) of every recorded process."""
        found = {name: self._record(name) for name in self.names()}
        return {n: (r["pid"], r["argv"][0]) for n, r in found.items() if r}

    def check_alive(self, name: str) -> None:
        if not self.alive(name):
            raise ClusterError(
                f"{name} exited during start-up; last lines of {self.logs / name}.log:\n"
                + log_tail(self.logs / f"{name}.log")
            )

    def names(self) -> list[str]:
        """Recorded processes, newest first, the order to stop them in."""
        files = sorted(self.pids.glob("*.json"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        return [f.stem for f in files]

    def stop_all(self, grace: float = 10.0) -> list[str]:
        return [name for name in self.names() if self.stop(name, grace)]

    def argv(self, name: str) -> list[str]:
        record = self._record(name)
        if record is None:
            raise ClusterError(f"{name} is not a process of this cluster")
        return record["argv"]

    def restart(self, name: str, env: dict[str, str] | None = None) -> int:
        """Stops a recorded process and starts it again with the same argv."""
        argv = self.argv(name)
        self.stop(name)
        return self.start(name, argv, env)

    def stop(self, name: str, grace: float = 10.0) -> bool:
        """Stops one recorded process; True when it was running."""
        record = self._record(name)
        running = bool(record and is_ours(record["pid"], record["argv"][0]))
        if running:
            _terminate(record["pid"], grace)
        (self.pids / f"{name}.json").unlink(missing_ok=True)
        self._children.pop(name, None)
        return running

    def _record(self, name: str) -> dict | None:
        try:
            return json.loads((self.pids / f"{name}.json").read_text())
        except (OSError, ValueError):
            return None


def is_ours(pid: int, binary: str) -> bool:
    """True while `pid` is a live (not zombie) process running `binary`."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    zombie = stat.rsplit(")", 1)[1].split()[0] == "Z"
    return cmdline == binary and not zombie


def _terminate(pid: int, grace: float) -> None:
    """SIGTERM the process group, then SIGKILL whatever outlives the grace period."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        _reap(pid)
        time.sleep(0.1)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    _reap(pid)


def _reap(pid: int) -> None:
    """Collects our own child's exit status, so a stopped process leaves no zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
