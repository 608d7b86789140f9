# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which holders are orphaned: their server or job is gone, yet they hold GPU memory (docs/guard.md).

Built on the owner block of _owners (docs/owners.md) and the snapshot's holders. A holder is orphaned, with one
reason, when the host shows that what it served has ended:

- `vllm_server_exited`: a vLLM engine process (process title `VLLM::...`: `VLLM::EngineCore`, `VLLM::Worker_TP0`,
  as vLLM's setproctitle names them; the kernel cuts the name to 15 bytes) whose engine tree hangs from a process
  that is not its server. vLLM starts EngineCore, and EngineCore its workers, as multiprocessing processes: the
  starter holds the read end of a pipe whose write end the child holds (Process.sentinel, through which vLLM's API
  server watches its engines). The topmost `VLLM::` process's parent is its live server, whatever its command line
  and wherever it sits (a container's init, a launcher that is not `vllm serve`), when it holds that read end;
  when it does not, the server is gone and the kernel handed the tree to an init or a subreaper. vLLM starts them
  by fork or spawn only (vllm/envs.py VLLM_WORKER_MULTIPROC_METHOD, choices fork and spawn), never through a
  forkserver, whose children hang from the forkserver and not from the process that asked for them.
- `unit_inactive`: its systemd service, a unit of the system manager (_owners: below slices only) that the manager
  has loaded, is `inactive` or `failed` (`systemctl show -p LoadState,ActiveState`): the service was stopped and
  left this process behind (KillMode=process or none).
- `slurm_job_ended`: its Slurm job has no `slurmstepd: [JOB.STEP]` process left on the host (each job step's
  slurmstepd titles itself so while the step runs), decided only in the initial PID namespace, where every
  slurmstepd of the host can be seen.
- `pod_gone`: its Kubernetes pod's directory `/var/lib/kubelet/pods/<UID>` is gone while the kubelet's
  `/var/lib/kubelet/pods` exists (the kubelet removes a pod's directory once the pod is deleted).
- `exited_creator`: it holds the context of a creator that has exited (docs/attribution.md, rule 2:
  `contexts_of`), as a forked child of a dead trainer does.

Anything else is not orphaned: a piece the host does not show is never taken as "gone". A container whose
runtime removed it is not decided here (that needs the runtime); its pod is.
"""

from __future__ import annotations

import os
import re
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Set, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners, _proc, _shapes

# Why a holder is orphaned (see the module's docstring).
Reason = Literal["vllm_server_exited", "unit_inactive", "slurm_job_ended", "pod_gone", "exited_creator"]
REASONS: Tuple[Reason, ...] = ("vllm_server_exited", "unit_inactive", "slurm_job_ended", "pod_gone", "exited_creator")
# Runs systemctl: argv -> (exit status, stdout), or None when it cannot be run (_owners._run_systemctl).
Run = Callable[[List[str]], Optional[Tuple[int, str]]]
# A holder of a snapshot, with its owner block (_owners.owner_of).
HolderLike = Mapping[str, Any]


class Orphan(TypedDict):
    """An orphaned holder (orphans): its identity, why, its owner in words, and its memory per GPU (MiB)."""

    pid: int
    start_ticks: int
    comm: str
    reason: Reason
    owner_label: str
    gpus: List[int]
    memory_mib: Dict[str, Optional[int]]


VLLM_TITLE = "VLLM::"
INACTIVE_STATES = ("inactive", "failed")
KUBELET_PODS = "/var/lib/kubelet/pods"
_MAX_DEPTH = 64
_PIPE_RE = re.compile(r"^pipe:\[([0-9]+)\]$")


def _stat(pid: int, proc: str) -> Optional[_proc.Stat]:
    return _proc.read_stat(pid, proc) if pid > 0 else None


def pipe_ends(pid: int, proc: str = "/proc", lowest_fd: int = 0) -> Optional[Set[Tuple[str, int]]]:
    """The pipe ends `pid` holds on its fds from `lowest_fd` up: {(pipe inode, os.O_RDONLY or os.O_WRONLY)}, from the
    /proc/PID/fd links (`pipe:[INODE]`) and the `flags:` of /proc/PID/fdinfo; None when its fds cannot be read."""
    base = "%s/%d" % (proc, pid)
    try:
        names = os.listdir(base + "/fd")
    except OSError:
        return None
    ends: Set[Tuple[str, int]] = set()
    for name in names:
        if not name.isdigit() or int(name) < lowest_fd:
            continue
        try:
            found = _PIPE_RE.match(os.readlink("%s/fd/%s" % (base, name)))
            mode = _access_mode("%s/fdinfo/%s" % (base, name)) if found else None
        except OSError:  # closed meanwhile
            continue
        if found and mode is not None:
            ends.add((found.group(1), mode))
    return ends


def _access_mode(fdinfo: str) -> Optional[int]:
    with open(fdinfo, "r") as handle:
        for line in handle:
            if line.startswith("flags:"):
                return int(line.split()[1], 8) & os.O_ACCMODE
    return None


def holds_sentinel(parent: int, child: int, proc: str = "/proc") -> Optional[bool]:
    """Whether `parent` holds the read end of a pipe whose write end `child` holds (on fd 3 or above): the sentinel
    that Python's multiprocessing leaves between a process and the child it started (Process.sentinel: EOF once
    the child is gone). None when either fd table cannot be read, or `child` holds no pipe's write end at all."""
    written = [inode for inode, mode in pipe_ends(child, proc, lowest_fd=3) or () if mode == os.O_WRONLY]
    read = pipe_ends(parent, proc)
    if not written or read is None:
        return None
    return any((inode, os.O_RDONLY) in read for inode in written)


def _engine_top(holder: HolderLike, proc: str) -> Optional[Tuple[int, int, str]]:
    """(the topmost VLLM:: process of the holder's tree, its parent, the parent's state), or None when a parent
    cannot be read."""
    child, parent = holder["pid"], holder.get("ppid") or 0
    for _step in range(_MAX_DEPTH):
        stat = _stat(parent, proc)
        if stat is None:
            return None
        if not stat["comm"].startswith(VLLM_TITLE):
            return child, parent, stat["state"]
        child, parent = parent, stat["ppid"]
    return None


def vllm_server_exited(holder: HolderLike, proc: str = "/proc") -> bool:
    """True when `holder` is a vLLM engine process whose engine tree hangs from a process that is not its server
    (see the module's docstring). A holder that is not titled VLLM::, or whose parents or fds cannot be read, is
    not called orphaned."""
    if not (holder.get("comm") or "").startswith(VLLM_TITLE):
        return False
    top = _engine_top(holder, proc)
    if top is None or top[2] == "Z":  # a zombie leader with a child: its other threads live on
        return False
    return holds_sentinel(top[1], top[0], proc) is False


def unit_state(unit: str, systemctl: str = "systemctl", run: Optional[Run] = None) -> Optional[str]:
    """ActiveState of `unit` (`active`, `inactive`, `failed`, ...) from `systemctl show`, where the system manager
    has it loaded; None where it does not (LoadState `not-found`: systemctl answers `inactive` with exit 0 for a
    unit it does not know, systemd#1105) or systemctl cannot say (absent, no systemd, past its deadline).
    `run(argv)` -> (rc, stdout) or None replaces the call."""
    result = (run or _owners._run_systemctl)([systemctl, "show", "-p", "LoadState,ActiveState", "--", unit])
    if result is None or result[0] != 0:
        return None
    values = dict(line.split("=", 1) for line in result[1].splitlines() if "=" in line)
    if values.get("LoadState") != "loaded":
        return None
    return values.get("ActiveState") or None


def live_slurm_jobs(proc: str = "/proc") -> Set[str]:
    """Job ids that have a `slurmstepd: [JOB.STEP]` process on this host."""
    jobs: Set[str] = set()
    for pid in _proc.list_pids(proc):
        argv = _proc.read_argv(pid, proc) or []
        title = " ".join(argv)
        if title.startswith("slurmstepd: ["):
            jobs.add(title[len("slurmstepd: [") :].split(".", 1)[0].split("]", 1)[0])
    return jobs


def pod_gone(pod_uid: str, kubelet_pods: str = KUBELET_PODS) -> bool:
    """True when the kubelet's pods directory exists and has no directory for `pod_uid`."""
    return os.path.isdir(kubelet_pods) and not os.path.exists(os.path.join(kubelet_pods, pod_uid))


class Judge:
    """Decides the orphan reason of each holder of one snapshot; asks systemctl once per unit and lists the live
    Slurm jobs once. `initial_pidns`: /proc is the host's (only there is a Slurm job called ended)."""

    def __init__(
        self,
        proc: str = "/proc",
        initial_pidns: bool = False,
        systemctl: str = "systemctl",
        run: Optional[Run] = None,
        kubelet_pods: str = KUBELET_PODS,
    ) -> None:
        self.proc = proc
        self.initial_pidns = initial_pidns
        self.systemctl = systemctl
        self.run = run
        self.kubelet_pods = kubelet_pods
        self._units: Dict[str, Optional[str]] = {}
        self._jobs: Optional[Set[str]] = None

    def _unit_inactive(self, unit: str) -> bool:
        if unit not in self._units:
            self._units[unit] = unit_state(unit, self.systemctl, self.run)
        return self._units[unit] in INACTIVE_STATES

    def _job_ended(self, job: str) -> bool:
        if not self.initial_pidns:
            return False
        if self._jobs is None:
            self._jobs = live_slurm_jobs(self.proc)
        return job not in self._jobs

    def reason(self, holder: HolderLike) -> Optional[Reason]:
        """The orphan reason of `holder` (one of REASONS), or None when it is not orphaned."""
        owner = holder.get("owner") or {}
        if vllm_server_exited(holder, self.proc):
            return "vllm_server_exited"
        unit = owner.get("systemd_unit") or ""
        if unit.endswith(".service") and self._unit_inactive(unit):
            return "unit_inactive"
        if owner.get("slurm_job") and self._job_ended(owner["slurm_job"]):
            return "slurm_job_ended"
        if owner.get("pod_uid") and pod_gone(owner["pod_uid"], self.kubelet_pods):
            return "pod_gone"
        if any(holder.get("contexts_of") or {}):
            return "exited_creator"
        return None


def orphans(snapshot: _shapes.Snapshot, judge: Judge) -> List[Orphan]:
    """The orphaned holders of `snapshot` (holders with owner blocks): [{"pid", "start_ticks", "comm", "reason",
    "owner_label", "gpus", "memory_mib" ({"i": MiB or None})}], by PID."""
    found: List[Orphan] = []
    # Holders with their owner block ("owner", added by the snapshot where it reads owners).
    holders: List[HolderLike] = list(snapshot.get("holders", []))
    for holder in sorted(holders, key=lambda h: h["pid"]):
        reason = judge.reason(holder)
        if reason is None:
            continue
        found.append(
            {
                "pid": holder["pid"],
                "start_ticks": holder["start_ticks"],
                "comm": holder.get("comm") or "",
                "reason": reason,
                "owner_label": _owners.owner_label(holder.get("owner")),
                "gpus": list(holder.get("gpus") or []),
                "memory_mib": dict(holder.get("memory_mib") or {}),
            }
        )
    return found
