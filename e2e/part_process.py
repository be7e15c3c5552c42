"""One InferGrid part run as a real process for e2e tests and benchmarks.

A process, not a thread, so a test can SIGKILL it in the middle of its work
and start a new one, as when its pod is evicted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.request
from pathlib import Path

from e2e.cluster.processes import wait_until


class PartProcess:
    def __init__(self, name: str, kubeconfig: Path, log: Path, ready_url: str):
        self.name = name
        self.kubeconfig = kubeconfig
        self.log = log
        self.ready_url = ready_url
        self.proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
            )
        wait_until(self.ready, 60, f"the {self.name} to be ready", self._running)

    def ready(self) -> bool:
        with urllib.request.urlopen(self.ready_url, timeout=2) as resp:
            return resp.status == 200

    def _running(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"the {self.name} exited; see {self.log}")

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, no chance to finish what it was doing."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
