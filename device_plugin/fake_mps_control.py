"""``nvidia-cuda-mps-control`` where there is no GPU: the same interface, and a record of its use.

``-d`` forks a daemon and returns 0 once it answers. The daemon binds the
``control`` socket and writes its pid file in ``CUDA_MPS_PIPE_DIRECTORY``, and
logs to ``control.log`` in ``CUDA_MPS_LOG_DIRECTORY``. Without ``-d`` the
program is a client: each line of stdin is a command, sent through that socket,
its answer printed; with no daemon answering it fails (exit 1), as the real one
does. ``get_server_list`` answers the (empty) list of servers, since this daemon
never runs work; ``quit`` removes the socket and pid file and ends the daemon;
any other command is answered as unknown. The daemon records every command,
and its own start with the GPU it was shown (``CUDA_VISIBLE_DEVICES``), one JSON
object a line in ``fake-mps-control.jsonl`` beside ``control.log``.

A test kills the daemon (SIGKILL, its pid from the pid file) to simulate a
crash, which leaves the socket and pid file behind as a real crash does, or
stops it (SIGSTOP) to simulate a daemon that is stuck: its socket still takes
connections, and no answer ever comes.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from infergrid.share_edits import CONTROL_SOCKET, PID_FILE

DEFAULT_PIPE: Final = "/tmp/nvidia-mps"
DEFAULT_LOG: Final = "/var/log/nvidia-mps"
RECORD: Final = "fake-mps-control.jsonl"
NO_DAEMON: Final = "Cannot find MPS control daemon process"
USAGE: Final = "usage: infergrid-fake-mps-control [-d]  (commands on stdin)"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE)
    if args == ["-d"]:
        return _daemonize(pipe, Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY") or DEFAULT_LOG))
    if args in (["-h"], ["--help"]):
        print(USAGE)
        return 0
    if args:
        print(USAGE, file=sys.stderr)
        return 2
    return _client(pipe, sys.stdin)


def _client(pipe: Path, lines: Iterable[str]) -> int:
    for line in lines:
        command = line.strip()
        if not command:
            continue
        try:
            answer = _ask(pipe / CONTROL_SOCKET, command)
        except OSError:
            print(NO_DAEMON, file=sys.stderr)
            return 1
        sys.stdout.write(answer)
    return 0


def _ask(path: Path, command: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.connect(str(path))
        conn.sendall(command.encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
        return _read_all(conn).decode()


def _read_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


def _daemonize(pipe: Path, log: Path) -> int:
    """Fork the daemon; 0 once it answers, 1 when one already answers here or it failed."""
    try:
        _ask(pipe / CONTROL_SOCKET, "get_server_list")
    except OSError:
        pass
    else:
        print(f"An MPS control daemon already runs with pipe directory {pipe}", file=sys.stderr)
        return 1
    ready_r, ready_w = os.pipe()
    if os.fork():
        os.close(ready_w)
        with os.fdopen(ready_r, "rb") as ready:
            return 0 if ready.read(1) == b"1" else 1
    os.close(ready_r)
    os.setsid()
    _detach()
    try:
        _serve(pipe, log, ready_w)
    finally:
        os._exit(0)


def _detach() -> None:
    """Give up the caller's stdin, stdout and stderr, as a daemon does, so no pipe waits on it."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _serve(pipe: Path, log: Path, ready_fd: int) -> None:
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    control = pipe / CONTROL_SOCKET
    control.unlink(missing_ok=True)  # a killed daemon's socket
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(control))
        server.listen(16)
        (pipe / PID_FILE).write_text(f"{os.getpid()}\n")
        _note(log, "-d", visibleDevices=os.environ.get("CUDA_VISIBLE_DEVICES", ""))
        os.write(ready_fd, b"1")
        os.close(ready_fd)
        while _answer_one(server, pipe, log):
            pass


def _answer_one(server: socket.socket, pipe: Path, log: Path) -> bool:
    """Answer one client; False once told to quit."""
    conn, _ = server.accept()
    with conn:
        command = _read_all(conn).decode().strip()
        _note(log, command)
        if command == "quit":
            (pipe / PID_FILE).unlink(missing_ok=True)
            (pipe / CONTROL_SOCKET).unlink(missing_ok=True)
            return False
        conn.sendall(
            b"" if command == "get_server_list" else f"Unknown command {command}\n".encode()
        )
        return True


def _note(log: Path, command: str, **details: str) -> None:
    """One line in control.log, as the real daemon keeps, and one record for tests."""
    pid, now = os.getpid(), time.time()
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    with (log / "control.log").open("a") as text:
        text.write(f"[{stamp} Control {pid}] {command}\n")
    with (log / RECORD).open("a") as record:
        record.write(json.dumps({"at": now, "pid": pid, "command": command, **details}) + "\n")


if __name__ == "__main__":
    sys.exit(main())
