"""The hardware edge of MPS: running ``nvidia-cuda-mps-control``, as a daemon or as a client.

``-d`` starts a control daemon in the background; without it the program is a
client that sends each line of its stdin to the daemon whose pipe folder
``CUDA_MPS_PIPE_DIRECTORY`` names, prints the answers and fails when no daemon
answers. Everything here goes through that program (the real one, or
``fake_mps_control`` where there is no GPU) and the files it leaves in the pipe
folder, never through a private protocol, so what works on the fake works the
same on a GPU node.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Final, TextIO

from infergrid.share_edits import MpsPaths

PROBE: Final = "get_server_list"
"""A command every control daemon answers at once, without starting a server: the health probe."""
TIMEOUT_S: Final = 5.0


class MpsControlError(Exception):
    """The control program failed, or no daemon answered; the message says which and why."""


def start_daemon(control: str, env: Mapping[str, str], timeout_s: float = TIMEOUT_S) -> None:
    """Start a control daemon with ``env`` (its GPU and folders); returns once it has forked."""
    _run([control, "-d"], env, None, timeout_s)


def send(control: str, paths: MpsPaths, command: str, timeout_s: float = TIMEOUT_S) -> str:
    """``command``'s answer from the daemon of ``paths``; MpsControlError when none answers in time.

    A daemon that stopped answering (stopped, or stuck) takes the whole timeout to tell.
    """
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": str(paths.pipe)}
    return _run([control], env, command + "\n", timeout_s)


def probe_daemon(control: str, paths: MpsPaths, timeout_s: float = TIMEOUT_S) -> str | None:
    """None when the daemon of ``paths`` answers the health probe in time; else why not."""
    try:
        send(control, paths, PROBE, timeout_s)
    except MpsControlError as err:
        return str(err)
    return None


def read_pid(paths: MpsPaths) -> int | None:
    """The pid the daemon wrote into its pid file; None when there is none, or it is garbled.

    The pid is in the daemon container's PID namespace: for telling one daemon from
    the next, not for signalling it from another container.
    """
    try:
        return int(paths.pid_file.read_text().strip())
    except (OSError, ValueError):
        return None


def _run(argv: list[str], env: Mapping[str, str], stdin: str | None, timeout_s: float) -> str:
    """The program's output. It writes to memory files, not pipes: a daemon that keeps the
    descriptors it inherited would hold a pipe open, and reading it would wait for the
    daemon to end rather than for the program. In memory, as the plugin's root is read-only."""
    with _memory_file() as out, _memory_file() as err:
        try:
            done = subprocess.run(
                argv,
                input=stdin,
                stdin=None if stdin is not None else subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=dict(env),
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise MpsControlError(
                f"{_shown(argv, stdin)}: no answer within {timeout_s:g} s"
            ) from None
        except OSError as error:
            raise MpsControlError(f"cannot run {argv[0]}: {error}") from None
        out.seek(0)
        err.seek(0)
        said, complaint = out.read(), err.read()
    if done.returncode != 0:
        why = (complaint or said).strip() or "no message"
        raise MpsControlError(f"{_shown(argv, stdin)} failed (exit {done.returncode}): {why}")
    return said


def _memory_file() -> TextIO:
    return os.fdopen(os.memfd_create("mps-control"), "w+")


def _shown(argv: list[str], stdin: str | None) -> str:
    """``nvidia-cuda-mps-control -d``, or ``get_server_list`` for a command sent on stdin."""
    return repr(stdin.strip()) if stdin else " ".join([Path(argv[0]).name, *argv[1:]])
