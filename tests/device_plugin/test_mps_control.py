"""The MPS control program behind the edge, on the fake: it behaves as the real one where the
plugin depends on it (daemon, pid file, socket, commands through the pipe folder, quit, failure
with no daemon), records what it was told, and can be killed or stuck by a test."""

from __future__ import annotations

import os
import signal
import time

import pytest

from device_plugin.mps import daemon_env
from device_plugin.mps_control import PROBE, MpsControlError, read_pid, send, start_daemon
from infergrid.share_edits import gpu_paths

UUID = "GPU-11111111-2222-3333-4444-555555555555"


def test_a_daemon_answers_through_its_pipe_folder_and_records_what_it_is_told(mps_daemons):
    mps_daemons.start(UUID)
    paths = gpu_paths(mps_daemons.root, UUID)
    assert paths.control_socket.is_socket()
    assert read_pid(paths) == mps_daemons.pid(UUID)
    assert send(mps_daemons.control, paths, PROBE) == ""  # no server runs yet
    assert "Unknown command" in send(mps_daemons.control, paths, "start_server -uid 0")
    pid = mps_daemons.pid(UUID)
    assert [(r["pid"], r["command"]) for r in mps_daemons.records(UUID)] == [
        (pid, "-d"),
        (pid, PROBE),
        (pid, "start_server -uid 0"),
    ]
    assert mps_daemons.records(UUID)[0]["visibleDevices"] == UUID
    assert "get_server_list" in (paths.log / "control.log").read_text()


def test_quit_ends_the_daemon_and_takes_its_socket_and_pid_file(mps_daemons):
    mps_daemons.start(UUID)
    paths = gpu_paths(mps_daemons.root, UUID)
    send(mps_daemons.control, paths, "quit")
    assert not paths.pid_file.exists() and not paths.control_socket.exists()
    assert read_pid(paths) is None
    with pytest.raises(MpsControlError, match="Cannot find MPS control daemon process"):
        send(mps_daemons.control, paths, PROBE)


def test_with_no_daemon_a_command_fails(mps_daemons):
    paths = gpu_paths(mps_daemons.root, UUID)
    with pytest.raises(MpsControlError) as failed:
        send(mps_daemons.control, paths, PROBE)
    assert str(failed.value) == (
        "'get_server_list' failed (exit 1): Cannot find MPS control daemon process"
    )


def test_a_second_daemon_on_the_same_pipe_folder_is_refused(mps_daemons):
    mps_daemons.start(UUID)
    with pytest.raises(MpsControlError, match="already runs with pipe directory"):
        start_daemon(mps_daemons.control, daemon_env(os.environ, mps_daemons.root, UUID))


def test_a_killed_daemon_leaves_its_files_and_a_new_one_starts_over_them(mps_daemons):
    mps_daemons.start(UUID)
    paths, first = gpu_paths(mps_daemons.root, UUID), mps_daemons.pid(UUID)
    mps_daemons.kill(UUID)
    assert paths.control_socket.exists() and read_pid(paths) == first
    with pytest.raises(MpsControlError, match="exit 1"):
        send(mps_daemons.control, paths, PROBE)
    mps_daemons.start(UUID)
    assert mps_daemons.pid(UUID) != first
    assert send(mps_daemons.control, paths, PROBE) == ""


def test_a_stuck_daemon_is_told_by_the_timeout(mps_daemons):
    mps_daemons.start(UUID)
    mps_daemons.kill(UUID, signal.SIGSTOP)
    began = time.monotonic()
    with pytest.raises(MpsControlError, match="'get_server_list': no answer within 0.5 s"):
        send(mps_daemons.control, gpu_paths(mps_daemons.root, UUID), PROBE, timeout_s=0.5)
    assert time.monotonic() - began < 3


def test_a_control_program_that_is_not_there_is_named():
    with pytest.raises(MpsControlError, match="cannot run /nowhere/nvidia-cuda-mps-control"):
        start_daemon("/nowhere/nvidia-cuda-mps-control", {})
