# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which holders are orphaned: their server or job is gone, yet they hold GPU memory (docs/guard.md).

Built on the owner block of _owners (docs/owners.md) and the snapshot's holders. A holder is orphaned, with one
reason, when the host shows that what it served has ended:

- `vllm_server_exited`: a vLLM engine process (process title `VLLM::...`: `VLLM::EngineCore`, `VLLM::Worker_TP0`,
  as vLLM's setproctitle names them; the kernel cuts the name to 15 bytes) whose engine tree was handed to the init
  of its PID namespace: the API server that started the topmost `VLLM::` process is gone (the kernel reparents
  the children of a dead process to the init, or to a subreaper), and no live `vllm serve` is its ancestor.
- `unit_inactive`: its systemd service is `inactive` or `failed` (`systemctl show -p ActiveState`): the service
  was stopped and left this process behind (KillMode=process or none).
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


def _stat(pid: int, proc: str) -> Optional[_proc.Stat]:
    return _proc.read_stat(pid, proc) if pid > 0 else None


def is_namespace_init(pid: int, proc: str = "/proc") -> bool:
    """True when `pid` is PID 1 here or the init of its own PID namespace (its innermost NSpid is 1)."""
    if pid == 1:
        return True
    nspids = _proc.read_nspids(pid, proc)
    return len(nspids) > 1 and nspids[-1] == 1


def vllm_server_exited(holder: HolderLike, proc: str = "/proc") -> bool:
    """True when `holder` is a vLLM engine process whose engine tree now hangs from an init (see the module's
    docstring). A holder that is not titled VLLM::, or whose parents cannot be read, is not called orphaned."""
    if not (holder.get("comm") or "").startswith(VLLM_TITLE):
        return False
    agent = (holder.get("owner") or {}).get("agent")
    if agent and agent.get("kind") == "vllm":
        return False
    parent = holder.get("ppid") or 0
    for _step in range(_MAX_DEPTH):
        stat = _stat(parent, proc)
        if stat is None:
            return False
        if not stat["comm"].startswith(VLLM_TITLE):
            return is_namespace_init(parent, proc)
        parent = stat["ppid"]
    return False


def unit_state(unit: str, systemctl: str = "systemctl", run: Optional[Run] = None) -> Optional[str]:
    """ActiveState of `unit` (`active`, `inactive`, `failed`, ...) from `systemctl show`, or None when systemctl
    cannot say (absent, no systemd, past its deadline). `run(argv)` -> (rc, stdout) or None replaces the call."""
    result = (run or _owners._run_systemctl)([systemctl, "show", "-p", "ActiveState", "--value", "--", unit])
    if result is None or result[0] != 0:
        return None
    value = result[1].strip()
    return value or None


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
