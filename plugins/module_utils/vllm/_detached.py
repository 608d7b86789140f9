# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Long-running processes without a service manager: the `nohup cmd > log &` of GPU hosts, done safely.

A detached process is started in its own session (setsid: it is the session and process group
leader, its PID is the session ID), with stdin on /dev/null and stdout/stderr appended to a log
file. Its pidfile holds one line, "PID START_TICKS", the start time (/proc/PID/stat field 22)
identifying the process beyond its PID.

Stopping ends every member of that session: processes whose session ID is the leader's PID and
that started no earlier than the leader. That covers children that outlived the leader (vLLM's
EngineCore and TP workers after the API server was SIGKILLed), since they keep the session ID;
Linux does not hand out a PID while it is still in use as a session ID, so the members found are
the leader's descendants. Processes are signalled through _terminate (pidfd-pinned, SIGTERM, wait,
SIGKILL). Processes that left the session (setsid again) are not found here.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from typing import Any, Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options, _proc, _terminate


# The lists of a stop that _terminate.end_until_gone fills: member dicts plus what befell each.
EndedKey = Literal["signalled", "exited", "survived", "not_signalled"]
_ENDED_KEYS: Tuple[EndedKey, ...] = ("signalled", "exited", "survived", "not_signalled")


class DetachedStop(TypedDict):
    """What stop returns; plugins/modules/detached_process.py's RETURN says what each key means."""

    changed: bool
    pid: Optional[int]
    would_signal: List[_proc.Brief]
    signalled: List[Mapping[str, object]]
    exited: List[Mapping[str, object]]
    survived: List[Mapping[str, object]]
    not_signalled: List[Mapping[str, object]]


class DetachedError(Exception):
    """The process cannot be started or stopped as asked (message says why)."""


def read_pidfile(path: str) -> _proc.ProcessId | None:
    """The _proc.ProcessId (pid, start_ticks) of a pidfile, or None when the file does not exist.

    Raises DetachedError for a file that exists but does not hold "PID START_TICKS".
    """
    try:
        with open(path) as pidfile:
            text = pidfile.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise DetachedError("cannot read pidfile %s: %s" % (path, exc))
    fields = text.split()
    if len(fields) != 2 or not all(field.isdigit() for field in fields):
        raise DetachedError("pidfile %s does not hold 'PID START_TICKS': %r" % (path, text[:80]))
    return _proc.ProcessId(int(fields[0]), int(fields[1]))


def write_pidfile(path: str, pid: int, start_ticks: int) -> None:
    """Write "PID START_TICKS" atomically (temporary file in the same directory, then rename)."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as pidfile:
        pidfile.write("%d %d\n" % (pid, start_ticks))
    os.replace(tmp, path)


def remove_pidfile(path: str) -> None:
    """Remove a pidfile; one that is not there is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def session_members(record: Tuple[int, int], proc: str = "/proc") -> list[_proc.Brief]:
    """Live processes of the session led by `record` (pid, start_ticks), leader included when alive.

    Returns holder-like dicts {"pid", "ppid", "comm", "cmdline", "start_ticks"} sorted by PID, for
    _terminate.end_processes. When the leader's PID now belongs to another process (a stale pidfile),
    that session is not ours: returns [].
    """
    sid, leader_ticks = record
    leader = _proc.read_stat(sid, proc)
    if leader is not None and leader["start_ticks"] != leader_ticks:
        return []
    members: List[_proc.Brief] = []
    for pid in _proc.list_pids(proc):
        stat = _proc.read_stat(pid, proc)
        if stat is None or stat["sid"] != sid or stat["start_ticks"] < leader_ticks or stat["state"] in ("Z", "X"):
            continue
        members.append(_proc.brief(pid, stat, proc))
    return sorted(members, key=lambda member: member["pid"])


def read_environment_files(paths: Iterable[str]) -> dict[str, str]:
    """Variables from files of KEY=VALUE lines, later files winning (like systemd's EnvironmentFile=).

    Blank lines and lines starting with # or ; are skipped; a value in matching single or double quotes
    is unquoted. Raises DetachedError for an unreadable file or a line without "=".
    """
    environment: Dict[str, str] = {}
    for path in paths:
        try:
            with open(path) as env_file:
                lines = env_file.read().splitlines()
        except OSError as exc:
            raise DetachedError("cannot read environment file %s: %s" % (path, exc))
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            key, sep, value = line.partition("=")
            key, value = key.strip(), value.strip()
            if not sep or not key:
                raise DetachedError("%s line %d is not KEY=VALUE" % (path, number))
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            environment[key] = value
    return environment


# Popen objects of the processes started here. This process never waits for them; dropping one would
# make Python reap the child when it is collected, or warn that it still runs.
_STARTED: List[subprocess.Popen[bytes]] = []


def _spawn(argv: Sequence[str], env: Mapping[str, str], cwd: str, log_fd: int) -> int:
    """Start `argv` in a new session, stdin on /dev/null, stdout/stderr on `log_fd`; return the child's PID.

    subprocess reports an exec (or chdir) error of the child as OSError: DetachedError. Every other
    descriptor is closed in the child, so it keeps no pipe of Ansible's open.
    """
    # Not AnsibleModule.run_command: it waits for the command to end, and a detached server runs on after the module.
    try:
        process = subprocess.Popen(  # pylint: disable=ansible-bad-function
            argv,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=log_fd,
            stderr=log_fd,
            close_fds=True,
            cwd=cwd,
            env=env,
        )
    except OSError as exc:
        raise DetachedError("cannot execute %s: %s" % (argv[0], exc.strerror or exc))
    _STARTED.append(process)
    return process.pid


def start(
    argv: Sequence[str],
    log_file: str,
    environment: Mapping[str, Any] | None = None,
    environment_files: Iterable[str] = (),
    cwd: str = "/",
    inherit_environment: bool = True,
    proc: str = "/proc",
) -> Tuple[int, int, int]:
    """Start `argv` in a new session with stdio on /dev/null and `log_file` (appended); return (pid, start_ticks,
    log_offset), log_offset the size of the log before this start wrote to it (where its lines begin).

    The environment is this process's (when `inherit_environment`), then the variables of
    `environment_files`, then `environment`. A line naming the time and the command is appended to the
    log first (on one line), so each start is found in it. Raises DetachedError when the command cannot be
    executed. The child is not waited for: when this process exits it is reparented (to init or a subreaper).
    """
    env = dict(os.environ) if inherit_environment else {}
    env.update(read_environment_files(environment_files))
    env.update((str(key), str(value)) for key, value in (environment or {}).items())
    try:
        log_fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
    except OSError as exc:
        raise DetachedError("cannot open log file %s: %s" % (log_file, exc))
    try:
        log_offset = os.fstat(log_fd).st_size
        command = " ".join(shlex.quote(arg) for arg in argv).replace("\n", "\\n")
        os.write(
            log_fd,
            ("=== %s detached_process: starting %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S%z"), command)).encode(),
        )
        pid = _spawn(argv, env, cwd, log_fd)
    finally:
        os.close(log_fd)
    # Not reaped before this process exits, so /proc/PID/stat exists even if the child died at once.
    start_ticks = _proc.read_start_ticks(pid, proc)
    if start_ticks is None:
        raise DetachedError("PID %d has no /proc/PID/stat right after its start: cannot write its pidfile" % pid)
    return pid, start_ticks, log_offset


def stop(
    pidfile: str,
    grace_period: float = _options.DETACHED["grace_period"].default,
    kill_wait: float = _options.DETACHED["kill_wait"].default,
    check_mode: bool = False,
    proc: str = "/proc",
) -> DetachedStop:
    """End every member of the session recorded in `pidfile` (SIGTERM, `grace_period` s, SIGKILL, `kill_wait` s).

    Members started meanwhile by dying processes are ended too (up to 3 rounds). The pidfile is removed
    once nothing survived. Returns {"changed", "pid" (leader PID or None), "would_signal", "signalled",
    "exited", "survived", "not_signalled"} (lists of member dicts as in _terminate.end_processes).
    """
    result: DetachedStop = {
        "changed": False,
        "pid": None,
        "would_signal": [],
        "signalled": [],
        "exited": [],
        "survived": [],
        "not_signalled": [],
    }
    record = read_pidfile(pidfile)
    if record is None:
        return result
    result["pid"] = record[0]
    result["changed"] = True  # at least the pidfile goes
    members = session_members(record, proc)
    if check_mode:
        result["would_signal"] = members
        return result
    # _terminate takes plain dicts (it adds what befell each): copies of the members.
    outcome = _terminate.end_until_gone(
        lambda _first: [dict(member) for member in session_members(record, proc)],
        [dict(member) for member in members],
        signal.SIGTERM,
        grace_period,
        kill_wait,
        proc=proc,
    )
    for key in _ENDED_KEYS:
        result[key].extend(outcome[key])
    if outcome["survived"]:
        return result
    remove_pidfile(pidfile)
    return result
