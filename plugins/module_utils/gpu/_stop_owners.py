# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_kill's stop_owners, in one place: which owners it stops, what a stop ends and when it refuses. The lines that say
what it stopped are _owner_lines'.

A systemd unit with a Restart= policy starts its holders again once they are ended; stop_owners stops it first.
Stopping a unit ends every process of its cgroup (systemd.kill(5): KillMode=control-group, the default), not only
the holders gpu_kill selected. So a unit is stopped only when all it runs is the selection's own work:

- the targets (the selected holders) and what they started;
- where a target's owner block names an agent that runs one job and ends with it (a vLLM API server, torchrun, an
  MPI launcher: JOB_AGENTS), that agent and all it started (the API server and its EngineCore hold no GPU);
- nothing else: a holder of another GPU or one the selection leaves alone, and a process that holds no GPU (cron
  beside a cron job that holds one, a backup job), is beyond the selection. Then the unit is stopped only with
  stop_spanning_owners, and the run names each of them. A unit that runs this module itself is never stopped.

Every process a stop ends is named, in check mode and in the run (`unit_processes`).

A docker or podman container (no pod) is stopped the same way, through its runtime: `podman stop -t N ID` (or docker's),
N the reset's grace period, the call itself bounded (CONTAINER_STOP_MARGIN_S more). Stopping a container ends every
process of its cgroup (`container_processes`), under the same rule. The container's init (PID 1 of its PID namespace:
catatonit or tini under `--init`, a shell entrypoint) runs nothing of its own: it is "the container's init", not beyond
the selection; what it runs is judged as above. A container that a service unit runs (quadlet) is stopped with its
unit, and the unit's monitor (conmon, the init's parent) is "the container's monitor". Pods and the containers of other
runtimes are never stopped: the command that stops them is reported, with the holders it would end beyond the
selection.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Literal
from typing import Mapping, NamedTuple, Optional, Sequence, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owner_lines, _owners, _proc

if TYPE_CHECKING:
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _select, _shapes

# Agents (_owners.agent_kind) whose processes are one job that ends with its workers. A Ray raylet and supervisord
# run other work beside the selected processes: what they started is not the selection's.
JOB_AGENTS = ("vllm", "torchrun", "mpi")
OWN_CHAIN = "this module or one of its ancestors"
# The runtimes whose containers stop_owners stops (a pod's containers are the kubelet's; containerd and CRI-O run pods).
STOPPED_RUNTIMES = ("docker", "podman")
# Seconds a container's stop may take beyond its stop timeout: the runtime's SIGKILL, its wait and its cleanup.
CONTAINER_STOP_MARGIN_S = 60
CONTAINER_INIT = "the container's init"
CONTAINER_MONITOR = "the container's monitor"

# What stop_owners acts on: a systemd unit it stops, a container or pod whose stop command it reports.
OwnerKind = Literal["unit", "container", "pod"]
OwnerKey = Tuple[OwnerKind, str]
# A holder as gpu_kill selects it: a snapshot holder with its owner block and the words _report.annotate adds.
Process = Mapping[str, Any]
# AnsibleModule.run_command(argv) -> (rc, stdout, stderr) and AnsibleModule.get_bin_path(name) -> path or None.
RunCommand = Callable[[List[str]], Tuple[int, str, str]]
Which = Callable[[str], Optional[str]]
# run(argv, timeout_s) -> (rc, stdout, stderr); rc None when it did not end within timeout_s (run_bounded).
RunBounded = Callable[[List[str], float], Tuple[Optional[int], str, str]]


class _UnitProcess(TypedDict):
    pid: int
    comm: str
    cmdline: str
    start_ticks: Optional[int]
    gpus: List[int]  # the GPUs it holds, [] for none
    why: str  # "selected", "part of the selected work", or why it is beyond the selection
    beyond: bool


class UnitProcess(_UnitProcess, total=False):
    """A process that stopping a unit ends (unit_processes); "ended" once the unit was stopped (stop_units)."""

    ended: bool


class BeyondProcess(TypedDict):
    """A process beyond the selection that an owner's stop would end."""

    pid: int
    comm: str
    gpus: List[int]
    reason: str


class BeyondOwner(TypedDict):
    """An owner whose stop reaches beyond the selection (owners_beyond)."""

    kind: OwnerKind
    owner: str  # in words
    unit: Optional[str]  # the unit's name; None for a container or pod
    command: Optional[str]  # the command that stops it
    stops: bool  # stop_owners stops it (a unit, a docker or podman container); false: its command is only reported
    processes: List[BeyondProcess]


class ContainerStop(TypedDict):
    """A container stop_owners stops through its runtime (containers_to_stop)."""

    id: str  # 64 hex
    runtime: str  # "docker" or "podman"
    command: str  # the command run, as _owners.stop_command words it


class StopPlan(TypedDict):
    """stop_owners' plan (plan)."""

    units: List[str]
    unit_processes: Dict[str, List[UnitProcess]]
    containers: List[ContainerStop]
    container_processes: Dict[str, List[UnitProcess]]  # by container id (64 hex)
    beyond: List[BeyondOwner]


class Stopped(NamedTuple):
    """What stop_units and stop_containers did: the units stopped (in order, up to a failure), each unit's processes
    with "ended", why it stopped short (None when every owner was stopped), the containers stopped and theirs."""

    units: List[str]
    unit_processes: Dict[str, List[UnitProcess]]
    failure: Optional[str]
    containers: List[ContainerStop] = []
    container_processes: Dict[str, List[UnitProcess]] = {}


def stoppable_unit(owner: Optional[_owners.Owner]) -> Optional[str]:
    """The systemd unit that stop_owners stops for a holder with this owner block, or None: the service that runs its
    container (quadlet, _owners.container_unit), or a unit that starts it again (Restart=), where no container or pod
    owns it."""
    owner = owner or _owners.Owner()
    unit = _owners.container_unit(owner)
    if unit:
        return unit
    if owner.get("container_id") or owner.get("pod_uid"):
        return None
    return _owners.restarting_unit(owner)


def stoppable_container(owner: Optional[_owners.Owner]) -> Optional[str]:
    """The id of the docker or podman container that stop_owners stops for a holder with this owner block, or None
    (no container, a pod's, another runtime's, a rootless one (under user@UID.service), or one that a unit runs:
    stoppable_unit)."""
    owner = owner or _owners.Owner()
    if owner.get("runtime") not in STOPPED_RUNTIMES or _owners.container_stop_argv(owner) is None:
        return None
    if str(owner.get("systemd_unit") or "").startswith("user@"):
        return None  # a rootless container: root's runtime does not know it; its line names the user's command
    return owner.get("container_id")


def containers_to_stop(targets: Iterable[Process], timeout_s: Optional[float]) -> List[ContainerStop]:
    """The docker and podman containers that own a target, with the command that stops each: the runtime's stop with
    `timeout_s` seconds between the stop signal and SIGKILL."""
    found: Dict[str, ContainerStop] = {}
    for target in targets:
        owner = _owner(target)
        container_id = stoppable_container(owner)
        if container_id and owner and container_id not in found:
            command = _owners.stop_command(owner, timeout_s) or ""
            found[container_id] = ContainerStop(id=container_id, runtime=str(owner.get("runtime")), command=command)
    return [found[key] for key in sorted(found)]


def _owner(process: Mapping[str, Any]) -> Optional[_owners.Owner]:
    """The owner block of a holder (the snapshot reads it with owners=True), or None."""
    owner: Optional[_owners.Owner] = process.get("owner")
    return owner


def units_to_stop(targets: Iterable[Process]) -> List[str]:
    """The systemd units with a Restart= policy that own a target (stop_owners stops them first)."""
    return sorted({unit for unit in (stoppable_unit(_owner(t)) for t in targets) if unit})


def owner_key(owner: Optional[_owners.Owner]) -> Optional[OwnerKey]:
    """What stop_owners acts on for this owner: ("unit", name), ("container", id), ("pod", uid), or None."""
    owner = owner or _owners.Owner()
    pod_uid, container_id = owner.get("pod_uid"), owner.get("container_id")
    if pod_uid:
        return ("pod", pod_uid)
    unit = stoppable_unit(owner)
    if container_id and not unit:
        return ("container", container_id)
    return ("unit", unit) if unit else None


def unit_members(unit: str, targets: Iterable[Process], proc: str = "/proc") -> List[_proc.Brief]:
    """Every process of `unit`'s cgroup: [{"pid", "ppid", "comm", "cmdline", "start_ticks"}], read from /proc (the
    cgroup's path from a target's /proc/PID/cgroup); [] when no target of the unit can be read any more."""
    mine = [t for t in targets if stoppable_unit(_owner(t)) == unit]
    return _members(mine, lambda text: _owners.unit_cgroup(text, unit), proc)


def container_members(container_id: str, targets: Iterable[Process], proc: str = "/proc") -> List[_proc.Brief]:
    """Every process of the container's cgroup (and the cgroups below it), as unit_members."""
    mine = [t for t in targets if stoppable_container(_owner(t)) == container_id]
    return _members(mine, lambda text: _owners.container_cgroup(text, container_id), proc)


def _members(
    targets: Iterable[Process], path_of: Callable[[Optional[str]], Optional[str]], proc: str
) -> List[_proc.Brief]:
    for target in targets:
        path = path_of(_owners.read_cgroup(target["pid"], proc))
        if not path:
            continue
        stats = {pid: _proc.read_stat(pid, proc) for pid in _owners.cgroup_members(path, proc)}
        return [_proc.brief(pid, stat, proc) for pid, stat in stats.items() if stat and stat["state"] not in ("Z", "X")]
    return []


def machinery(members: Iterable[_proc.Brief], proc: str = "/proc") -> Dict[int, str]:
    """The members that are a container's machinery, not work: {pid: CONTAINER_INIT} for the init of a PID namespace
    below the reader's (NSpid ends in 1: when it ends, the kernel ends every process of its namespace,
    pid_namespaces(7)), {pid: CONTAINER_MONITOR} for such an init's parent among `members` (conmon in a quadlet unit)."""
    members = list(members)
    found: Dict[int, str] = {}
    for member in members:
        nspids = _proc.read_nspids(member["pid"], proc)
        if len(nspids) > 1 and nspids[-1] == 1:
            found[member["pid"]] = CONTAINER_INIT
    pids = {m["pid"] for m in members}
    for member in members:
        if found.get(member["pid"]) == CONTAINER_INIT and member["ppid"] in pids and member["ppid"] not in found:
            found[member["ppid"]] = CONTAINER_MONITOR
    return found


def own_work(members: Iterable[_proc.Brief], targets: Iterable[Process]) -> set[int]:
    """PIDs of `members` that are the selection's own work: targets, their agents of JOB_AGENTS, and what either
    started (a process whose parent chain within `members` reaches one of them)."""
    roots = {t["pid"] for t in targets}
    for target in targets:
        agent = (_owner(target) or _owners.Owner()).get("agent")
        if agent and agent.get("kind") in JOB_AGENTS:
            roots.add(agent["pid"])
    parents = {m["pid"]: m["ppid"] for m in members}
    inside = set()
    for member in members:
        pid, seen = member["pid"], set()
        while pid in parents and pid not in seen:
            if pid in roots:
                inside.add(member["pid"])
                break
            seen.add(pid)
            pid = parents[pid]
    return inside


def _why_beyond(holder: Process, selection: _select.Selection) -> str:
    if not selection.covers(holder):
        return "outside the selection"
    return "not selected (%s)" % (selection.narrowing_reason(holder) or "protected or excluded")


def _entry(process: Mapping[str, Any], gpus: Iterable[int], why: str, beyond: bool) -> UnitProcess:
    return {
        "pid": process["pid"],
        "comm": process["comm"],
        "cmdline": process.get("cmdline") or "",
        "start_ticks": process.get("start_ticks"),
        "gpus": sorted(gpus),
        "why": why,
        "beyond": beyond,
    }


def unit_processes(
    unit: str, targets: Sequence[Process], snapshot: _shapes.Snapshot, selection: _select.Selection, proc: str = "/proc"
) -> List[UnitProcess]:
    """What stopping `unit` ends: an entry per process of its cgroup ({"pid", "comm", "cmdline", "start_ticks",
    "gpus" (the GPUs it holds, [] for none), "why", "beyond"}), the targets first. `why` is "selected", "part of the
    selected work" (own_work), or why it is beyond the selection: "outside the selection", "not selected (...)",
    "holds no GPU", OWN_CHAIN. Targets that the cgroup scan did not see (gone meanwhile) are left out."""
    mine = [t for t in targets if stoppable_unit(_owner(t)) == unit]
    return _judged(unit_members(unit, mine, proc), mine, snapshot, selection, proc)


def container_processes(
    container_id: str,
    targets: Sequence[Process],
    snapshot: _shapes.Snapshot,
    selection: _select.Selection,
    proc: str = "/proc",
) -> List[UnitProcess]:
    """What stopping the container ends, as unit_processes says it for a unit."""
    mine = [t for t in targets if stoppable_container(_owner(t)) == container_id]
    return _judged(container_members(container_id, mine, proc), mine, snapshot, selection, proc)


def _judged(
    members: List[_proc.Brief],
    mine: Sequence[Process],
    snapshot: _shapes.Snapshot,
    selection: _select.Selection,
    proc: str,
) -> List[UnitProcess]:
    holders = {h["pid"]: h for h in snapshot["holders"]}
    work = own_work(members, mine)
    tools = machinery(members, proc)
    chosen = {t["pid"] for t in mine}
    found = []
    for member in members:
        holder = holders.get(member["pid"])
        gpus = holder["gpus"] if holder else ()
        if member["pid"] in selection.own_chain:
            found.append(_entry(member, gpus, OWN_CHAIN, True))
        elif member["pid"] in chosen:
            found.append(_entry(member, gpus, "selected", False))
        elif holder:
            found.append(_entry(member, gpus, _why_beyond(holder, selection), True))
        elif member["pid"] in work:
            found.append(_entry(member, gpus, "part of the selected work", False))
        elif member["pid"] in tools:
            found.append(_entry(member, gpus, tools[member["pid"]], False))
        else:
            found.append(_entry(member, gpus, "holds no GPU", True))
    return sorted(found, key=lambda entry: (entry["why"] != "selected", entry["pid"]))


def plan(
    targets: Sequence[Process],
    snapshot: _shapes.Snapshot,
    selection: _select.Selection,
    proc: str = "/proc",
    timeout_s: Optional[float] = None,
) -> StopPlan:
    """stop_owners' plan: {"units": the units it stops, "unit_processes": {unit: unit_processes(...)}, "containers":
    the docker and podman containers it stops (each with its runtime's stop, `timeout_s` seconds before SIGKILL),
    "container_processes": {id: container_processes(...)}, "beyond": owners_beyond's list}."""
    units = units_to_stop(targets)
    processes = {unit: unit_processes(unit, targets, snapshot, selection, proc) for unit in units}
    containers = containers_to_stop(targets, timeout_s)
    inside = {c["id"]: container_processes(c["id"], targets, snapshot, selection, proc) for c in containers}
    return {
        "units": units,
        "unit_processes": processes,
        "containers": containers,
        "container_processes": inside,
        "beyond": owners_beyond(targets, snapshot, selection, processes, inside, timeout_s),
    }


def owners_beyond(
    targets: Sequence[Process],
    snapshot: _shapes.Snapshot,
    selection: _select.Selection,
    unit_processes_: Optional[Mapping[str, List[UnitProcess]]] = None,
    container_processes_: Optional[Mapping[str, List[UnitProcess]]] = None,
    timeout_s: Optional[float] = None,
) -> List[BeyondOwner]:
    """The owners stop_owners would stop (or report) that reach beyond the selection.

    Returns [{"kind": "unit", "container" or "pod", "owner": words, "unit": the unit's name (None for a container or
    pod), "command": the stop command (a container's with `timeout_s`), "stops": whether stop_owners stops it,
    "processes": [{"pid", "comm", "gpus", "reason"}]}]. For a unit or a docker or podman container, every process of
    its cgroup that is beyond the selection (`unit_processes_`, `container_processes_`; without them, its holders
    alone); for a pod or another runtime's container, which are never stopped, the holders its command would end
    beyond the selection.
    """
    keys: Dict[OwnerKey, _owners.Owner] = {}
    for target in targets:
        key = owner_key(_owner(target))
        if key and key not in keys:
            keys[key] = target["owner"]
    target_pids = {t["pid"] for t in targets}
    found: List[BeyondOwner] = []
    for key, owner in sorted(keys.items()):
        members = unit_processes_ if key[0] == "unit" else container_processes_ if key[0] == "container" else None
        if members and members.get(key[1]):
            others = [
                BeyondProcess(pid=p["pid"], comm=p["comm"], gpus=p["gpus"], reason=p["why"])
                for p in members[key[1]]
                if p["beyond"]
            ]
        else:
            others = [
                BeyondProcess(pid=h["pid"], comm=h["comm"], gpus=sorted(h["gpus"]), reason=_why_beyond(h, selection))
                for h in snapshot["holders"]
                if h["pid"] not in target_pids and owner_key(_owner(h)) == key
            ]
        if others:
            words = "systemd unit %s" % key[1] if key[0] == "unit" else _owners.owner_words(owner)
            found.append(
                BeyondOwner(
                    kind=key[0],
                    owner=words,
                    unit=key[1] if key[0] == "unit" else None,
                    command=_owners.stop_command(owner, timeout_s),
                    stops=key[0] == "unit" or (key[0] == "container" and stoppable_container(owner) is not None),
                    processes=others,
                )
            )
    return found


def refusal(beyond: List[BeyondOwner], spanning_allowed: bool) -> Optional[str]:
    """Why stop_owners stops nothing, or None: a unit or container that runs this module (always), or units and
    containers that reach beyond the selection (unless `spanning_allowed`, stop_spanning_owners)."""
    units = [item for item in beyond if item.get("stops", item["kind"] == "unit")]
    own = [item for item in units if any(p["reason"] == OWN_CHAIN for p in item["processes"])]
    if own:
        return (
            "stop_owners would stop %s; that would end this module's own process chain (Ansible, the SSH session). "
            "Leave stop_owners off to end only the selected PIDs, and stop the owner from elsewhere"
            % "; and ".join(_unit_and_processes(item) for item in own)
        )
    if not units or spanning_allowed:
        return None
    kinds = " or ".join(sorted({item["kind"] for item in units}, reverse=True))
    return (
        "stop_owners would stop %s; stopping a %s ends all its processes. Set stop_spanning_owners=true (role: "
        "reset_gpus_stop_spanning_owners: true) to stop it anyway, select those processes too, or leave stop_owners "
        "off to end only the selected PIDs" % ("; and ".join(_unit_and_processes(item) for item in units), kinds)
    )


def _unit_and_processes(item: BeyondOwner) -> str:
    return "%s, whose %s" % (item["owner"], ", ".join(_owner_lines.process_words(p) for p in item["processes"]))


def stop_units(
    units: List[str],
    processes: Mapping[str, List[UnitProcess]],
    run_command: RunCommand,
    which: Which,
    proc: str = "/proc",
) -> Stopped:
    """`systemctl stop` each unit of `units`, before the PIDs are ended. Returns the units stopped, `processes`
    (unit_processes of each unit) with "ended" on those of a stopped unit (whether the stop ended it), and the failure
    message that stopped it short (None when every unit was stopped)."""
    stopped: List[str] = []
    ended: Dict[str, List[UnitProcess]] = dict(processes)
    systemctl = which("systemctl") if units else None
    if units and not systemctl:
        failure = "stop_owners: systemctl is not on this host, so units %s cannot be stopped; nothing was signalled" % (
            ", ".join(units)
        )
        return Stopped(stopped, ended, failure)
    for unit in units:
        rc, _out, err = run_command([str(systemctl), "stop", unit])
        if rc != 0:
            failure = "systemctl stop %s failed (rc %s): %s; %s" % (
                unit,
                rc,
                err.strip() or "no error text",
                _signalled_before(stopped, []),
            )
            return Stopped(stopped, ended, failure)
        stopped.append(unit)
        ended[unit] = [_ended(process, proc) for process in processes.get(unit, [])]
    return Stopped(stopped, ended, None)


# Seconds to wait for a command killed at its timeout to be gone: one stuck in the kernel (D state) ignores SIGKILL.
_REAP_S = 2.0


def run_bounded(
    argv: List[str], timeout_s: float, environment: Optional[Mapping[str, str]] = None
) -> Tuple[Optional[int], str, str]:
    """(rc, stdout, stderr) of argv (stdin /dev/null, `environment` added to ours); rc None when it did not end
    within `timeout_s` seconds: then it is killed, and left behind if it is stuck in the kernel (D state), never
    waited for longer than _REAP_S."""
    # Not AnsibleModule.run_command: it has no timeout. Not subprocess.run: at its timeout it kills the command and
    # then waits for it without a bound, which a command stuck in the driver never ends.
    env = None
    if environment:
        env = dict(os.environ)
        env.update(environment)
    try:
        process = subprocess.Popen(  # pylint: disable=ansible-bad-function,consider-using-with
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
    except OSError as exc:
        return 127, "", str(exc)
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        try:
            process.communicate(timeout=_REAP_S)
        except subprocess.TimeoutExpired:
            pass  # stuck in the kernel: left behind rather than waited for
        return None, "", "no answer within %s s" % timeout_s
    return process.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def stop_containers(
    stopped: Stopped,
    containers: List[ContainerStop],
    processes: Mapping[str, List[UnitProcess]],
    which: Which,
    timeout_s: float,
    run: Optional[RunBounded] = None,
    proc: str = "/proc",
) -> Stopped:
    """Run each container's stop command (its runtime found with `which`), after stop_units did `stopped`; the call is
    bounded at `timeout_s` + CONTAINER_STOP_MARGIN_S seconds. Returns `stopped` with the containers stopped, their
    processes with "ended", and the failure that stopped it short."""
    done: List[ContainerStop] = []
    ended: Dict[str, List[UnitProcess]] = dict(processes)
    for container in containers:
        tool = which(container["runtime"])
        argv = container["command"].split()
        rc, _out, err = (
            (run or run_bounded)([str(tool)] + argv[1:], timeout_s + CONTAINER_STOP_MARGIN_S)
            if tool
            else (127, "", "%s is not on this host" % container["runtime"])
        )
        if rc != 0:
            failure = "%s failed (%s): %s; %s" % (
                container["command"],
                "rc %s" % rc if rc is not None else "no answer within %s s" % (timeout_s + CONTAINER_STOP_MARGIN_S),
                err.strip() or "no error text",
                _signalled_before(stopped.units, done),
            )
            return stopped._replace(containers=done, container_processes=ended, failure=failure)
        done.append(container)
        ended[container["id"]] = [_ended(process, proc) for process in processes.get(container["id"], [])]
    return stopped._replace(containers=done, container_processes=ended)


def _signalled_before(units: List[str], containers: List[ContainerStop]) -> str:
    """What a failed stop leaves said: the units and containers stopped before it (their stop signalled their
    processes), or that nothing was signalled."""
    before = ["unit %s" % unit for unit in units] + ["container %s" % c["id"][:12] for c in containers]
    if not before:
        return "nothing was signalled"
    return "stopped before it: %s; no process was signalled otherwise" % ", ".join(before)


def _ended(process: UnitProcess, proc: str) -> UnitProcess:
    """A copy of `process` with "ended": whether the process is gone (PID and start ticks)."""
    copy = process.copy()
    copy["ended"] = not _proc.ProcessId(process["pid"], process["start_ticks"]).alive(proc)
    return copy


def owner_commands(targets: Iterable[Process]) -> List[str]:
    """The commands that stop the pods of the targets and the containers that stop_owners does not stop (reported,
    never run): each target's `owner_command` (_report.annotate), else its owner's stop_command."""
    found = set()
    for target in targets:
        owner = _owner(target)
        if not owner or not (owner.get("container_id") or owner.get("pod_uid")):
            continue
        if stoppable_container(owner) or _owners.container_unit(owner):
            continue
        command = target.get("owner_command") or _owners.stop_command(owner)
        if command:
            found.add(command)
    return sorted(found)
