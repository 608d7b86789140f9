# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_kill's stop_owners, in one place: which owners it stops, what a stop ends, when it refuses, and the words.

A systemd unit with a Restart= policy starts its holders again once they are ended; stop_owners stops it first.
Stopping a unit ends every process of its cgroup (systemd.kill(5): KillMode=control-group, the default), not only
the holders gpu_kill selected. So a unit is stopped only when all it runs is the selection's own work:

- the targets (the selected holders) and what they started;
- where a target's owner block names an agent that runs one job and ends with it (a vLLM API server, torchrun, an
  MPI launcher: JOB_AGENTS), that agent and all it started (the API server and its EngineCore hold no GPU);
- nothing else: a holder of another GPU or one the selection leaves alone, and a process that holds no GPU (cron
  beside a cron job that holds one, a backup job), is beyond the selection. Then the unit is stopped only with
  stop_spanning_owners, and the run names each of them. A unit that runs this module itself is never stopped.

Every process a stop ends is named, in check mode and in the run (`unit_processes`). Containers and pods are never
stopped: the command that stops them is reported, with the holders it would end beyond the selection.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Literal
from typing import Mapping, NamedTuple, Optional, Sequence, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners, _proc

if TYPE_CHECKING:
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _select, _shapes

# Agents (_owners.agent_kind) whose processes are one job that ends with its workers. A Ray raylet and supervisord
# run other work beside the selected processes: what they started is not the selection's.
JOB_AGENTS = ("vllm", "torchrun", "mpi")
OWN_CHAIN = "this module or one of its ancestors"

# What stop_owners acts on: a systemd unit it stops, a container or pod whose stop command it reports.
OwnerKind = Literal["unit", "container", "pod"]
OwnerKey = Tuple[OwnerKind, str]
# A holder as gpu_kill selects it: a snapshot holder with its owner block and the words _report.annotate adds.
Process = Mapping[str, Any]
# AnsibleModule.run_command(argv) -> (rc, stdout, stderr) and AnsibleModule.get_bin_path(name) -> path or None.
RunCommand = Callable[[List[str]], Tuple[int, str, str]]
Which = Callable[[str], Optional[str]]


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
    processes: List[BeyondProcess]


class StopPlan(TypedDict):
    """stop_owners' plan (plan)."""

    units: List[str]
    unit_processes: Dict[str, List[UnitProcess]]
    beyond: List[BeyondOwner]


class Stopped(NamedTuple):
    """What stop_units did: the units stopped (in order, up to a failure), each unit's processes with "ended", and
    why it stopped short (None when every unit was stopped)."""

    units: List[str]
    unit_processes: Dict[str, List[UnitProcess]]
    failure: Optional[str]


def stoppable_unit(owner: Optional[_owners.Owner]) -> Optional[str]:
    """The systemd unit that stop_owners stops for a holder with this owner block, or None: a unit that starts it
    again (Restart=), where no container or pod owns it."""
    owner = owner or _owners.Owner()
    if owner.get("container_id") or owner.get("pod_uid"):
        return None
    return _owners.restarting_unit(owner)


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
    if container_id:
        return ("container", container_id)
    unit = stoppable_unit(owner)
    return ("unit", unit) if unit else None


def unit_members(unit: str, targets: Iterable[Process], proc: str = "/proc") -> List[_proc.Brief]:
    """Every process of `unit`'s cgroup: [{"pid", "ppid", "comm", "cmdline", "start_ticks"}], read from /proc (the
    cgroup's path from a target's /proc/PID/cgroup); [] when no target of the unit can be read any more."""
    for target in targets:
        if stoppable_unit(_owner(target)) != unit:
            continue
        path = _owners.unit_cgroup(_owners.read_cgroup(target["pid"], proc), unit)
        if not path:
            continue
        stats = {pid: _proc.read_stat(pid, proc) for pid in _owners.cgroup_members(path, proc)}
        return [_proc.brief(pid, stat, proc) for pid, stat in stats.items() if stat and stat["state"] not in ("Z", "X")]
    return []


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
    holders = {h["pid"]: h for h in snapshot["holders"]}
    mine = [t for t in targets if stoppable_unit(_owner(t)) == unit]
    members = unit_members(unit, mine, proc)
    work = own_work(members, mine)
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
        else:
            found.append(_entry(member, gpus, "holds no GPU", True))
    return sorted(found, key=lambda entry: (entry["why"] != "selected", entry["pid"]))


def plan(
    targets: Sequence[Process], snapshot: _shapes.Snapshot, selection: _select.Selection, proc: str = "/proc"
) -> StopPlan:
    """stop_owners' plan: {"units": the units it stops, "unit_processes": {unit: unit_processes(...)},
    "beyond": owners_beyond's list}."""
    units = units_to_stop(targets)
    processes = {unit: unit_processes(unit, targets, snapshot, selection, proc) for unit in units}
    return {
        "units": units,
        "unit_processes": processes,
        "beyond": owners_beyond(targets, snapshot, selection, processes),
    }


def owners_beyond(
    targets: Sequence[Process],
    snapshot: _shapes.Snapshot,
    selection: _select.Selection,
    unit_processes_: Optional[Mapping[str, List[UnitProcess]]] = None,
) -> List[BeyondOwner]:
    """The owners stop_owners would stop (or report) that reach beyond the selection.

    Returns [{"kind": "unit", "container" or "pod", "owner": words, "unit": the unit's name (None for a container or
    pod), "command": the stop command, "processes": [{"pid", "comm", "gpus", "reason"}]}]. For a unit, every process of its cgroup that is beyond the selection
    (`unit_processes_`, from unit_processes; without it, its holders alone); for a container or pod, which are never
    stopped, the holders its command would end beyond the selection.
    """
    keys: Dict[OwnerKey, _owners.Owner] = {}
    for target in targets:
        key = owner_key(_owner(target))
        if key and key not in keys:
            keys[key] = target["owner"]
    target_pids = {t["pid"] for t in targets}
    found: List[BeyondOwner] = []
    for key, owner in sorted(keys.items()):
        if key[0] == "unit" and unit_processes_ and unit_processes_.get(key[1]):
            others = [
                BeyondProcess(pid=p["pid"], comm=p["comm"], gpus=p["gpus"], reason=p["why"])
                for p in unit_processes_[key[1]]
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
                    command=_owners.stop_command(owner),
                    processes=others,
                )
            )
    return found


def _gpus(process: Mapping[str, Any]) -> str:
    gpus = process["gpus"]
    if not gpus:
        return "holds no GPU"
    return "holds GPU%s %s" % ("s" if len(gpus) > 1 else "", ", ".join(str(g) for g in gpus))


def _process_words(process: Mapping[str, Any]) -> str:
    """ "PID 8 (python3) holds GPU 4, outside the selection"; "PID 9 (cron) holds no GPU"."""
    words = "PID %s (%s) %s" % (process["pid"], process["comm"], _gpus(process))
    return words if process["reason"] == "holds no GPU" else "%s, %s" % (words, process["reason"])


def refusal(beyond: List[BeyondOwner], spanning_allowed: bool) -> Optional[str]:
    """Why stop_owners stops nothing, or None: a unit that runs this module (always), or units that reach beyond
    the selection (unless `spanning_allowed`, stop_spanning_owners)."""
    units = [item for item in beyond if item["kind"] == "unit"]
    own = [item for item in units if any(p["reason"] == OWN_CHAIN for p in item["processes"])]
    if own:
        return (
            "stop_owners would stop %s; that would end this module's own process chain (Ansible, the SSH session). "
            "Leave stop_owners off to end only the selected PIDs, and stop the unit from elsewhere"
            % "; and ".join(_unit_and_processes(item) for item in own)
        )
    if not units or spanning_allowed:
        return None
    return (
        "stop_owners would stop %s; stopping a unit ends all its processes. Set stop_spanning_owners=true (role: "
        "reset_gpus_stop_spanning_owners: true) to stop it anyway, select those processes too, or leave stop_owners "
        "off to end only the selected PIDs" % "; and ".join(_unit_and_processes(item) for item in units)
    )


def _unit_and_processes(item: BeyondOwner) -> str:
    return "%s, whose %s" % (item["owner"], ", ".join(_process_words(p) for p in item["processes"]))


def beyond_words(item: Mapping[str, Any], check_mode: bool) -> str:
    """An owner that stop_owners stops (or reports) and its processes beyond the selection, in words:
    "stopped systemd unit vllm@a.service, and with it, beyond the selection: PID 8 (python3) holds GPU 4, outside
    the selection"."""
    if item["kind"] == "unit":
        what = "would stop" if check_mode else "stopped"
    else:
        what = "%s (reported, not run) would stop" % item["command"]
    return "%s %s, and with it, beyond the selection: %s" % (
        what,
        item["owner"],
        ", ".join(_process_words(p) for p in item["processes"]),
    )


def beyond_lines(kill: Mapping[str, Any], check_mode: bool) -> List[str]:
    """The summary's lines of the owners that reach beyond the selection (beyond_words), but for a unit whose every
    process unit_lines names already."""
    named = {unit for unit, processes in (kill.get("unit_processes") or {}).items() if processes}
    return [
        "  " + beyond_words(item, check_mode)
        for item in kill.get("owners_beyond_selection", [])
        if item.get("unit") not in named
    ]


def unit_lines(kill: Mapping[str, Any], check_mode: bool) -> List[str]:
    """The summary's lines of the units stop_owners stops (or would), each with every process the stop ends:
    "  stopped systemd unit cron.service first (stop_owners), ending PID 5 cron (holds no GPU, beyond the selection),
    PID 9 python3 (holds GPU 4, selected)"."""
    units = kill.get("would_stop_units", []) if check_mode else kill.get("stopped_units", [])
    lines = []
    for unit in units:
        line = "  %s systemd unit %s first (stop_owners)" % ("would stop" if check_mode else "stopped", unit)
        processes = (kill.get("unit_processes") or {}).get(unit)
        if processes:
            line += ", %s %s" % (
                "ending" if check_mode else "which ended",
                ", ".join(_member_words(p, check_mode) for p in processes),
            )
        elif processes is not None:
            line += "; its processes could not be read before the stop"
        lines.append(line)
    return lines


def _member_words(process: Mapping[str, Any], check_mode: bool) -> str:
    why = "beyond the selection" if process["why"] == "holds no GPU" else process["why"]
    words = "PID %s %s (%s, %s)" % (process["pid"], process["comm"], _gpus(process), why)
    if not check_mode and process.get("ended") is False:
        words += " [still running after the stop]"
    return words


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
            failure = "systemctl stop %s failed (rc %s): %s; nothing was signalled" % (
                unit,
                rc,
                err.strip() or "no error text",
            )
            return Stopped(stopped, ended, failure)
        stopped.append(unit)
        ended[unit] = [_ended(process, proc) for process in processes.get(unit, [])]
    return Stopped(stopped, ended, None)


def _ended(process: UnitProcess, proc: str) -> UnitProcess:
    """A copy of `process` with "ended": whether the process is gone (PID and start ticks)."""
    copy = process.copy()
    copy["ended"] = not _proc.ProcessId(process["pid"], process["start_ticks"]).alive(proc)
    return copy


def owner_left_running(process: Mapping[str, Any], stopped_units: Iterable[str]) -> Optional[Tuple[str, Optional[str]]]:
    """(why ending `process` alone will not last, the command that stops its owner or None), or None: none when
    nothing starts it again, or when this run stopped its unit (stop_owners). `process` is a holder that
    _report.annotate annotated ("owner_note", "owner_command"). The one rule of owner_warning and owner_line."""
    note = process.get("owner_note")
    command = process.get("owner_command")
    if not note or command in {"systemctl stop %s" % unit for unit in stopped_units}:
        return None
    return note, command


def owner_warning(process: Mapping[str, Any], stopped_units: Iterable[str]) -> Optional[str]:
    """gpu_kill's warning for a holder whose owner will start it again (owner_left_running), or None: "PID 7
    (python3): systemd unit vllm.service restarts it (Restart=always); ending the PID alone will not last: stop the
    owner (systemctl stop vllm.service), or run with stop_owners=true"."""
    lasting = owner_left_running(process, stopped_units)
    if not lasting:
        return None
    note, command = lasting
    return "PID %s (%s): %s; ending the PID alone will not last%s" % (
        process["pid"],
        process["comm"],
        note,
        ": stop the owner (%s), or run with stop_owners=true" % command if command else "",
    )


def owner_line(process: Mapping[str, Any], stopped_units: Iterable[str] = ()) -> Optional[str]:
    """The summary's line under a holder whose owner will start it again (owner_left_running), or None:
    "    ending it alone will not last: NOTE; stop the owner: COMMAND"."""
    lasting = owner_left_running(process, stopped_units)
    if not lasting:
        return None
    note, command = lasting
    return "    ending it alone will not last: %s%s" % (note, "; stop the owner: %s" % command if command else "")


def owner_commands(targets: Iterable[Process]) -> List[str]:
    """The commands that stop the containers and pods of the targets (reported, never run)."""
    owners = [owner for owner in map(_owner, targets) if owner and (owner.get("container_id") or owner.get("pod_uid"))]
    return sorted({command for command in map(_owners.stop_command, owners) if command})
