# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Starting, finding and ending the check's GPU workloads (tests/gpu/workload.py).

Every workload carries this run's unique marker on its command line and reads a lifeline pipe whose
write end only the check holds, so nothing outlives the check. Each process reports readiness in
RUN_DIR/NAME.json (see workload.py); once ready it is pinned (procs.Pinned) under its name.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys

from gpucheck import procs
from gpucheck.timing import poll_until

WORKLOAD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "workload.py")
# Runs "$@" as a child of sh, so that the workload is not PID 1 of the nested namespace (PID 1 ignores
# signals it has no handler for, which is not the case being tested).
NESTED_SHELL = ["/bin/sh", "-c", '"$@"; :', "sh"]


NS_LAST_PID = "/proc/sys/kernel/ns_last_pid"
PR_SET_PDEATHSIG = 1


class WorkloadError(RuntimeError):
    """A workload failed to start or to allocate its memory (message: the reason and its log's tail)."""


class PidUnavailable(WorkloadError):
    """A workload could not be given the PID number it was meant to reuse (the reason says why)."""


def claim_pid(pid, last_pid_file=NS_LAST_PID):
    """Make `pid` the next PID this PID namespace gives, as CRIU restores PIDs: write pid - 1 to
    /proc/sys/kernel/ns_last_pid (needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE in the namespace's user namespace).
    Raises PidUnavailable when the number is taken or the file cannot be written."""
    if os.path.exists("/proc/%d" % pid):
        raise PidUnavailable("PID %d is taken by another process" % pid)
    try:
        with open(last_pid_file, "w") as last_pid:
            last_pid.write(str(pid - 1))
    except OSError as error:
        raise PidUnavailable("cannot write %s: %s" % (last_pid_file, error)) from None


def _die_with_parent():
    """In a child before exec: SIGKILL it when the thread that started it ends (a program that reads no lifeline)."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def log_tail(path, limit=1500):
    try:
        with open(path, "rb") as log:
            return log.read()[-limit:].decode(errors="replace")
    except OSError:
        return ""


class Workloads:
    """The check's workloads on one GPU.

    Workloads(run_dir, marker, backend, gpu_index, gpu_uuid): start(name, nested=False, env=None, **options) ->
    the launcher's Popen; start_at_pid(name, pid, **options); start_program(name, argv, env); wait_ready(names,
    launcher, timeout) -> {name: ready info with "host_pid"}; pin(name, pid); pid(name), alive(name), kill(name, sig);
    forget_gone(); stop_all() -> names (and PIDs) still alive afterwards.
    """

    def __init__(self, run_dir, marker, backend, gpu_index, gpu_uuid, python=sys.executable, max_lifetime=600.0):
        self.run_dir = run_dir
        self.marker = marker
        self.backend = backend
        self.gpu_index = gpu_index
        self.gpu_uuid = gpu_uuid
        self.python = python
        self.max_lifetime = max_lifetime
        self.lifeline_read, self.lifeline_write = os.pipe()
        os.set_inheritable(self.lifeline_read, True)
        self.launchers = []
        self.pinned = {}

    def environment(self, extra=None):
        """The workloads' environment: CUDA sees only the GPU under test, as device 0; `extra` added."""
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if self.backend != "sim":
            env.update(CUDA_VISIBLE_DEVICES=self.gpu_uuid, CUDA_DEVICE_ORDER="PCI_BUS_ID")
        env.update(extra or {})
        return env

    def command(  # pylint: disable=too-many-arguments
        self,
        name,
        role="hold",
        nbytes=0,
        title=None,
        ignore_sigterm=False,
        fork_child=False,
        tp=2,
        pinned_bytes=0,
        ipc_handle=None,
    ):
        """The workload.py command line for one process (see workload.py for the options)."""
        command = [
            self.python,
            WORKLOAD,
            "--name",
            name,
            "--role",
            role,
            "--run-dir",
            self.run_dir,
            "--marker",
            self.marker,
            "--backend",
            self.backend,
            "--bytes",
            str(nbytes),
            "--tp",
            str(tp),
            "--gpu-index",
            str(self.gpu_index),
            "--lifeline-fd",
            str(self.lifeline_read),
            "--max-lifetime",
            str(self.max_lifetime),
        ]
        if title:
            command += ["--title", title]
        if ignore_sigterm:
            command.append("--ignore-sigterm")
        if fork_child:
            command.append("--fork-child")
        if pinned_bytes:
            command += ["--pinned-bytes", str(pinned_bytes)]
        if ipc_handle:
            command += ["--ipc-handle", ipc_handle]
        return command

    def start(self, name, nested=False, env=None, new_session=True, **options):
        """Start workload `name` (options as command(); `env`: variables added to its environment); nested=True
        starts it in a new PID namespace with `unshare --pid --fork --mount-proc --kill-child` (plus a user namespace
        when not root). new_session=False keeps it in the check's session and process group: a session or group
        leader's PID number stays taken while a process of its group lives (its forked child), so only such a
        process's number can be reused after its death."""
        command = self.command(name, **options)
        if nested:
            user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
            command = ["unshare"] + user + ["--pid", "--fork", "--mount-proc", "--kill-child"] + NESTED_SHELL + command
        log = open(os.path.join(self.run_dir, name + ".log"), "wb")  # pylint: disable=consider-using-with
        try:
            launcher = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(env),
                pass_fds=(self.lifeline_read,),
                start_new_session=new_session,
            )
        finally:
            log.close()
        launcher.gpucheck_name = name
        self.launchers.append(launcher)
        return launcher

    def start_at_pid(self, name, pid, attempts=20, last_pid_file=NS_LAST_PID, **options):
        """Start workload `name` (as start()) with PID `pid`, a number freed when its process was reaped (claim_pid
        right before the fork). Another process that forks in between takes the number first: the launcher that
        got another PID is ended and the claim tried again, `attempts` times. Returns the launcher; raises
        PidUnavailable."""
        for _attempt in range(attempts):
            claim_pid(pid, last_pid_file)
            launcher = self.start(name, **options)
            if launcher.pid == pid:
                return launcher
            launcher.kill()
            launcher.wait()
            self.launchers.remove(launcher)
        raise PidUnavailable("PID %d went to other processes %d times" % (pid, attempts))

    def start_program(self, name, argv, env=None):
        """Start a program that is not workload.py (nvidia-smi, the MPS control daemon) as one of ours, pinned under
        `name` at once; its output goes to RUN_DIR/NAME.log, `env` is added to the workloads' environment. It reads no
        lifeline: it gets SIGKILL when the check's thread that started it ends (PR_SET_PDEATHSIG), and stop_all ends
        it like every pinned process. Returns its Popen."""
        log = open(os.path.join(self.run_dir, name + ".log"), "wb")  # pylint: disable=consider-using-with
        try:
            launcher = subprocess.Popen(  # pylint: disable=subprocess-popen-preexec-fn
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.environment(env),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        finally:
            log.close()
        launcher.gpucheck_name = name
        self.launchers.append(launcher)
        self.pin(name, launcher.pid, launcher)
        return launcher

    def pin(self, name, pid, popen=None):
        """Pin our process `pid` under `name` (one that a program of ours started, such as the MPS server)."""
        self.pinned[name] = procs.Pinned(pid, popen=popen)

    def log_path(self, name):
        """RUN_DIR/NAME.log: the output of workload or program `name`."""
        return os.path.join(self.run_dir, name + ".log")

    def _ready_info(self, name):
        try:
            with open(os.path.join(self.run_dir, name + ".json")) as ready:
                return json.load(ready)
        except (OSError, ValueError):
            return None

    def wait_ready(self, names, launcher, timeout):
        """Wait until every process in `names` reported ready; pin each under its name.

        Returns {name: ready info plus "host_pid"}. Raises WorkloadError when one reports an error,
        when the launcher exits first, or after `timeout` seconds.
        """
        names = list(names)

        def all_ready():
            infos = {name: self._ready_info(name) for name in names}
            for name, info in infos.items():
                if info and info.get("error"):
                    raise WorkloadError("%s: %s" % (name, info["error"]))
            if all(infos.values()):
                return infos
            if launcher.poll() is not None:
                raise WorkloadError(
                    "%s exited with status %s before %s were ready; log: %s"
                    % (
                        launcher.args[0],
                        launcher.returncode,
                        [n for n, i in infos.items() if not i],
                        log_tail(os.path.join(self.run_dir, launcher.gpucheck_name + ".log")),
                    )
                )
            return None

        infos = poll_until(all_ready, timeout, interval=0.05)
        if infos is None:
            missing = [name for name in names if not self._ready_info(name)]
            raise WorkloadError(
                "not ready after %.0f s: %s; logs: %s"
                % (
                    timeout,
                    missing,
                    {name: log_tail(os.path.join(self.run_dir, name + ".log"), 400) for name in missing},
                )
            )
        for name, info in infos.items():
            pid = info["pid"]
            if launcher.args[0] == "unshare":
                pid = procs.host_pid(info["pid"], launcher.pid)
                if pid is None:
                    raise WorkloadError(
                        "%s: no descendant of unshare (PID %d) has namespace PID %d" % (name, launcher.pid, info["pid"])
                    )
            info["host_pid"] = pid
            self.pin(name, pid, launcher if launcher.pid == pid else None)
        return infos

    def pid(self, name):
        return self.pinned[name].pid

    def alive(self, name):
        return self.pinned[name].alive()

    def kill(self, name, sig=signal.SIGKILL):
        """Signal our process `name`; False when it is gone (never signals a reused PID)."""
        return self.pinned[name].kill(sig)

    def forget_gone(self):
        """Unpin the processes that are gone (their names and pidfds are no longer needed)."""
        for name, pinned in list(self.pinned.items()):
            if not pinned.alive():
                pinned.close()
                del self.pinned[name]

    def stop_all(self, timeout=15.0):
        """SIGKILL every process this run started that is still alive, close the lifeline, and wait (idempotent).

        Also ends processes carrying this run's marker that were never pinned (a workload that had not
        reported ready). Returns ["NAME (PID)" or "PID" of each process still alive after `timeout`].
        """
        for pinned in self.pinned.values():
            pinned.kill(signal.SIGKILL)
        for launcher in self.launchers:
            if launcher.poll() is None:
                launcher.kill()
        if self.lifeline_write is not None:
            os.close(self.lifeline_write)  # every workload exits on EOF, also the ones never pinned
            self.lifeline_write = None
        own = {os.getpid(), os.getppid()}

        def stragglers():
            # A program started here is waited for through its Popen: a process loses the marker (its environment)
            # when its memory goes, before it has exited, and a caller that polls it at once would find it running.
            running = [launcher.pid for launcher in self.launchers if launcher.poll() is None]
            return running + [
                pid
                for pid in procs.processes_with(self.marker)
                if pid not in own
                and pid not in running
                and (procs.read_stat(pid) or {}).get("state") not in (None, "Z", "X")
            ]

        poll_until(lambda: not stragglers(), timeout, interval=0.05)
        left = stragglers()
        for pid in left:
            procs.Pinned(pid).kill(signal.SIGKILL)  # carries our unique marker: one of ours
        names = {pinned.pid: name for name, pinned in self.pinned.items()}
        for pinned in self.pinned.values():
            pinned.close()
        if self.lifeline_read is not None:
            os.close(self.lifeline_read)
            self.lifeline_read = None
        return ["%s (%d)" % (names[pid], pid) if pid in names else str(pid) for pid in left]
