# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_detached against real processes started by these tests (only those are ever signalled).

Every process started here is reaped by the test process (or, for the orphan case, by a helper that is a child
subreaper): this machine's PID 1 does not reap orphans.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _proc
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _detached
from polling import wait_for

# A leader with two children; on SIGTERM it waits for them (they get SIGTERM too) and exits.
LEADER = r"""
import signal, subprocess, sys, time
children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
def stop(*_):
    for child in children:
        child.wait()
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("CHILDREN", *[child.pid for child in children], flush=True)
time.sleep(60)
"""
IGNORES_SIGTERM = (
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\ntime.sleep(60)\n"
)


@pytest.fixture
def started(tmp_path):
    """started(argv, **start kwargs) -> (pid, start_ticks, pidfile): a detached process with its pidfile in tmp_path.

    At teardown each one's process group still alive is SIGKILLed and the leader reaped.
    """
    pids = []

    def start(argv, **kwargs):
        pidfile = str(tmp_path / ("p%d.pid" % len(pids)))
        pid, start_ticks, _offset = _detached.start(argv, str(tmp_path / "server.log"), **kwargs)
        _detached.write_pidfile(pidfile, pid, start_ticks)
        pids.append(pid)
        return pid, start_ticks, pidfile

    yield start
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(pid, 0)


def wait_for_line(path, prefix, timeout=10.0):
    """The first line of `path` starting with `prefix`, once there is one."""

    def line():
        return next((text for text in path.read_text().splitlines() if text.startswith(prefix)), None)

    return wait_for(line, timeout, 0.02, "a line %r in %s" % (prefix, path), log=path.read_text)


def test_pidfile_round_trip_and_errors(tmp_path):
    path = str(tmp_path / "x.pid")
    assert _detached.read_pidfile(path) is None
    _detached.write_pidfile(path, 4242, 98765)
    assert _detached.read_pidfile(path) == (4242, 98765) and os.listdir(str(tmp_path)) == ["x.pid"]
    (tmp_path / "x.pid").write_text("4242\n")
    with pytest.raises(_detached.DetachedError, match="does not hold 'PID START_TICKS'"):
        _detached.read_pidfile(path)


def test_environment_files_like_systemd(tmp_path):
    first, second = tmp_path / "a.env", tmp_path / "b.env"
    first.write_text("# comment\n; other comment\n\nVLLM_API_KEY='k 1'\nA = \"quoted\"\nB=x=y\n")
    second.write_text("A=later\n")
    assert _detached.read_environment_files([str(first), str(second)]) == {
        "VLLM_API_KEY": "k 1",
        "A": "later",
        "B": "x=y",
    }
    second.write_text("no equals sign\n")
    with pytest.raises(_detached.DetachedError, match="b.env line 1 is not KEY=VALUE"):
        _detached.read_environment_files([str(second)])
    with pytest.raises(_detached.DetachedError, match="cannot read environment file"):
        _detached.read_environment_files([str(tmp_path / "missing.env")])


def test_start_detaches_into_a_new_session_with_log_and_environment(tmp_path, started):
    env_file = tmp_path / "key.env"
    env_file.write_text("VLLM_API_KEY=secret\nFROM_FILE=file\n")
    code = (
        "import os, sys, time\n"
        "print('env', os.environ['VLLM_API_KEY'], os.environ['FROM_FILE'], os.environ.get('HOME'))\n"
        "print('cwd', os.getcwd(), flush=True)\n"
        "time.sleep(60)\n"
    )
    pid, start_ticks, _pidfile = started(
        [sys.executable, "-c", code],
        environment={"FROM_FILE": "explicit"},
        environment_files=[str(env_file)],
        cwd=str(tmp_path),
        inherit_environment=False,
    )
    log = tmp_path / "server.log"
    assert wait_for_line(log, "env ") == "env secret explicit None"
    assert wait_for_line(log, "cwd ") == "cwd %s" % tmp_path
    assert log.read_text().startswith("=== ") and "detached_process: starting %s -c" % sys.executable in log.read_text()
    stat = _proc.read_stat(pid)
    assert stat["sid"] == pid and stat["pgid"] == pid and stat["start_ticks"] == start_ticks
    assert os.readlink("/proc/%d/fd/0" % pid) == "/dev/null"
    assert os.readlink("/proc/%d/fd/1" % pid) == str(log) == os.readlink("/proc/%d/fd/2" % pid)
    assert _proc.ProcessId(pid, start_ticks).alive() and not _proc.ProcessId(pid, start_ticks + 1).alive()


def test_start_of_a_missing_executable_fails_clearly(tmp_path):
    with pytest.raises(_detached.DetachedError, match="cannot execute /nonexistent/vllm"):
        _detached.start(["/nonexistent/vllm", "serve"], str(tmp_path / "server.log"))


def test_stop_ends_the_whole_session_and_removes_the_pidfile(tmp_path, started):
    pid, start_ticks, pidfile = started([sys.executable, "-c", LEADER])
    children = [int(p) for p in wait_for_line(tmp_path / "server.log", "CHILDREN").split()[1:]]
    members = _detached.session_members((pid, start_ticks))
    assert [m["pid"] for m in members] == sorted([pid] + children)

    planned = _detached.stop(pidfile, check_mode=True)
    assert planned["changed"] and [m["pid"] for m in planned["would_signal"]] == sorted([pid] + children)
    assert planned["signalled"] == [] and _proc.ProcessId(pid, start_ticks).alive() and os.path.exists(pidfile)

    result = _detached.stop(pidfile, grace_period=10, kill_wait=5)
    assert result["changed"] and result["pid"] == pid and result["survived"] == []
    assert sorted(e["pid"] for e in result["exited"]) == sorted([pid] + children)
    assert all(e["signals"] == ["SIGTERM"] for e in result["signalled"])
    assert not os.path.exists(pidfile) and _detached.session_members((pid, start_ticks)) == []
    again = _detached.stop(pidfile)
    assert again["changed"] is False and again["pid"] is None


def test_stop_escalates_to_sigkill(tmp_path, started):
    pid, _start_ticks, pidfile = started([sys.executable, "-c", IGNORES_SIGTERM])
    wait_for_line(tmp_path / "server.log", "ready")
    result = _detached.stop(pidfile, grace_period=0.3, kill_wait=5)
    assert [e["pid"] for e in result["exited"]] == [pid] and result["exited"][0]["signals"] == ["SIGTERM", "SIGKILL"]
    assert result["exited"][0]["exited_after_s"] >= 0.3


def test_stale_pidfile_of_a_reused_pid_signals_nothing(tmp_path):
    pidfile = str(tmp_path / "stale.pid")
    own = _proc.read_stat(os.getpid())
    _detached.write_pidfile(pidfile, os.getpid(), own["start_ticks"] - 1)  # this PID, another start time
    assert _detached.session_members(_detached.read_pidfile(pidfile)) == []
    result = _detached.stop(pidfile)
    assert result["changed"] and result["signalled"] == [] and not os.path.exists(pidfile)


# Run in a child subreaper, so that the orphaned child is reparented to it and reaped.
ORPHAN_SCENARIO = r"""
import ctypes, json, os, signal, sys, time
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _proc
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _detached
directory = sys.argv[1]
pidfile, log = os.path.join(directory, "orphan.pid"), os.path.join(directory, "orphan.log")
leader = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
          "print('CHILD=%d' % c.pid, flush=True); time.sleep(60)")
pid, ticks, _offset = _detached.start([sys.executable, "-c", leader], log)
_detached.write_pidfile(pidfile, pid, ticks)
while "\nCHILD=" not in open(log).read():
    time.sleep(0.02)
child = int(open(log).read().split("\nCHILD=")[1].split()[0])
os.kill(pid, signal.SIGKILL)  # the leader dies like a SIGKILLed vLLM API server; its child is orphaned
os.waitpid(pid, 0)
result = _detached.stop(pidfile, grace_period=5, kill_wait=5)
while True:
    try:
        if os.waitpid(-1, 0)[0] <= 0:
            break
    except ChildProcessError:
        break
print(json.dumps({"child": child, "running": _proc.ProcessId(pid, ticks).alive(), "exited": [e["pid"] for e in result["exited"]],
                  "pidfile": os.path.exists(pidfile)}))
"""


def test_stop_ends_children_that_outlived_the_leader(tmp_path):
    collections = pathlib.Path(__file__).resolve().parents[4] / ".collections"
    run = subprocess.run(
        [sys.executable, "-c", ORPHAN_SCENARIO, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(collections)),
        check=False,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["exited"] == [result["child"]] and not result["running"] and not result["pidfile"]
