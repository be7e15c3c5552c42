"""The device plugin as a real process on fake NVML, registered with a kubelet stand-in.

It publishes onto whichever node it is told (a KWOK node, or a bare one a test made), as
the DaemonSet's pod would on a real node.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from device_plugin.fake_kubelet import FakeKubelet
from infergrid import constants


@contextmanager
def plugin_process(
    kubeconfig: Path, fleet: Path, node: str, log: Path, *args: str
) -> Iterator[tuple[FakeKubelet, subprocess.Popen]]:
    """The plugin for ``node`` of ``fleet``, registered; stopped (SIGTERM) afterwards."""
    plugin_dir = Path(tempfile.mkdtemp(prefix="dp-", dir="/tmp"))  # short socket paths
    kubelet = FakeKubelet(plugin_dir)
    kubelet.start()
    proc = spawn_plugin(kubeconfig, fleet, node, plugin_dir, log, *args)
    try:
        registered = kubelet.wait_registered({constants.RESOURCE_GPU}, timeout=30)
        assert registered, log.read_text()
        yield kubelet, proc
    finally:
        stop_plugin(proc, kubelet, plugin_dir)


def spawn_plugin(
    kubeconfig: Path, fleet: Path, node: str, plugin_dir: Path, log: Path, *args: str
) -> subprocess.Popen:
    """The plugin process for ``node``, registering in ``plugin_dir``: also how a test starts
    it again after killing it, as the DaemonSet's pod restarts."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [
                sys.executable, "-m", "device_plugin.main",
                "--fake-fleet", str(fleet), "--node", node, "--plugin-dir", str(plugin_dir),
                "--metrics-port", "0", *args,
            ],
            stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "KUBECONFIG": str(kubeconfig)},
        )  # fmt: skip


def stop_plugin(proc: subprocess.Popen, kubelet: FakeKubelet, plugin_dir: Path) -> None:
    """SIGTERM to a plugin still running, then its kubelet stand-in and folder go."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    kubelet.stop()
    shutil.rmtree(plugin_dir, ignore_errors=True)
