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

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners, _proc

# Agents (_owners.agent_kind) whose processes are one job that ends with its workers. A Ray raylet and supervisord
# run other work beside the selected processes: what they started is not the selection's.
JOB_AGENTS = ("vllm", "torchrun", "mpi")
OWN_CHAIN = "this module or one of its ancestors"


def stoppable_unit(owner):
    """The systemd unit that stop_owners stops for a holder with this owner block, or None."""
    owner = owner or {}
    if owner.get("unit_restart") in (None, "no") or owner.get("container_id") or owner.get("pod_uid"):
        return None
    return owner.get("systemd_unit")


def units_to_stop(targets):
    """The systemd units with a Restart= policy that own a target (stop_owners stops them first)."""
    return sorted({unit for unit in (stoppable_unit(t.get("owner")) for t in targets) if unit})


def owner_key(owner):
    """What stop_owners acts on for this owner: ("unit", name), ("container", id), ("pod", uid), or None."""
    owner = owner or {}
    if owner.get("pod_uid"):
        return ("pod", owner["pod_uid"])
    if owner.get("container_id"):
        return ("container", owner["container_id"])
    unit = stoppable_unit(owner)
    return ("unit", unit) if unit else None


def unit_members(unit, targets, proc="/proc"):
    """Every process of `unit`'s cgroup: [{"pid", "ppid", "comm", "cmdline", "start_ticks"}], read from /proc (the
    cgroup's path from a target's /proc/PID/cgroup); [] when no target of the unit can be read any more."""
    for target in targets:
        if stoppable_unit(target.get("owner")) != unit:
            continue
        path = _owners.unit_cgroup(_owners.read_cgroup(target["pid"], proc), unit)
        if not path:
            continue
        stats = {pid: _proc.read_stat(pid, proc) for pid in _owners.cgroup_members(path, proc)}
        return [_proc.brief(pid, stat, proc) for pid, stat in stats.items() if stat and stat["state"] not in ("Z", "X")]
    return []


def own_work(members, targets):
    """PIDs of `members` that are the selection's own work: targets, their agents of JOB_AGENTS, and what either
    started (a process whose parent chain within `members` reaches one of them)."""
    roots = {t["pid"] for t in targets}
    for target in targets:
        agent = (target.get("owner") or {}).get("agent")
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


def _why_beyond(holder, selection):
    if not selection.covers(holder):
        return "outside the selection"
    return "not selected (%s)" % (selection.narrowing_reason(holder) or "protected or excluded")


def _entry(process, gpus, why, beyond):
    return {
        "pid": process["pid"],
        "comm": process["comm"],
        "cmdline": process.get("cmdline") or "",
        "start_ticks": process.get("start_ticks"),
        "gpus": sorted(gpus),
        "why": why,
        "beyond": beyond,
    }


def unit_processes(unit, targets, snapshot, selection, proc="/proc"):
    """What stopping `unit` ends: an entry per process of its cgroup ({"pid", "comm", "cmdline", "start_ticks",
    "gpus" (the GPUs it holds, [] for none), "why", "beyond"}), the targets first. `why` is "selected", "part of the
    selected work" (own_work), or why it is beyond the selection: "outside the selection", "not selected (...)",
    "holds no GPU", OWN_CHAIN. Targets that the cgroup scan did not see (gone meanwhile) are left out."""
    holders = {h["pid"]: h for h in snapshot["holders"]}
    mine = [t for t in targets if stoppable_unit(t.get("owner")) == unit]
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


def plan(targets, snapshot, selection, proc="/proc"):
    """stop_owners' plan: {"units": the units it stops, "unit_processes": {unit: unit_processes(...)},
    "beyond": owners_beyond's list}."""
    units = units_to_stop(targets)
    processes = {unit: unit_processes(unit, targets, snapshot, selection, proc) for unit in units}
    return {
        "units": units,
        "unit_processes": processes,
        "beyond": owners_beyond(targets, snapshot, selection, processes),
    }


def owners_beyond(targets, snapshot, selection, unit_processes_=None):
    """The owners stop_owners would stop (or report) that reach beyond the selection.

    Returns [{"kind": "unit", "container" or "pod", "owner": words, "unit": the unit's name (None for a container or
    pod), "command": the stop command, "processes": [{"pid", "comm", "gpus", "reason"}]}]. For a unit, every process of its cgroup that is beyond the selection
    (`unit_processes_`, from unit_processes; without it, its holders alone); for a container or pod, which are never
    stopped, the holders its command would end beyond the selection.
    """
    keys = {}
    for target in targets:
        key = owner_key(target.get("owner"))
        if key and key not in keys:
            keys[key] = target["owner"]
    target_pids = {t["pid"] for t in targets}
    found = []
    for key, owner in sorted(keys.items()):
        if key[0] == "unit" and unit_processes_ and unit_processes_.get(key[1]):
            others = [
                {"pid": p["pid"], "comm": p["comm"], "gpus": p["gpus"], "reason": p["why"]}
                for p in unit_processes_[key[1]]
                if p["beyond"]
            ]
        else:
            others = [
                {"pid": h["pid"], "comm": h["comm"], "gpus": sorted(h["gpus"]), "reason": _why_beyond(h, selection)}
                for h in snapshot["holders"]
                if h["pid"] not in target_pids and owner_key(h.get("owner")) == key
            ]
        if others:
            words = "systemd unit %s" % key[1] if key[0] == "unit" else _owners.owner_words(owner)
            found.append(
                {
                    "kind": key[0],
                    "owner": words,
                    "unit": key[1] if key[0] == "unit" else None,
                    "command": _owners.stop_command(owner),
                    "processes": others,
                }
            )
    return found


def _gpus(process):
    gpus = process["gpus"]
    if not gpus:
        return "holds no GPU"
    return "holds GPU%s %s" % ("s" if len(gpus) > 1 else "", ", ".join(str(g) for g in gpus))


def _process_words(process):
    """ "PID 8 (python3) holds GPU 4, outside the selection"; "PID 9 (cron) holds no GPU"."""
    words = "PID %s (%s) %s" % (process["pid"], process["comm"], _gpus(process))
    return words if process["reason"] == "holds no GPU" else "%s, %s" % (words, process["reason"])


def refusal(beyond, spanning_allowed):
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


def _unit_and_processes(item):
    return "%s, whose %s" % (item["owner"], ", ".join(_process_words(p) for p in item["processes"]))


def beyond_words(item, check_mode):
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


def beyond_lines(kill, check_mode):
    """The summary's lines of the owners that reach beyond the selection (beyond_words), but for a unit whose every
    process unit_lines names already."""
    named = {unit for unit, processes in (kill.get("unit_processes") or {}).items() if processes}
    return [
        "  " + beyond_words(item, check_mode)
        for item in kill.get("owners_beyond_selection", [])
        if item.get("unit") not in named
    ]


def unit_lines(kill, check_mode):
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


def _member_words(process, check_mode):
    why = "beyond the selection" if process["why"] == "holds no GPU" else process["why"]
    words = "PID %s %s (%s, %s)" % (process["pid"], process["comm"], _gpus(process), why)
    if not check_mode and process.get("ended") is False:
        words += " [still running after the stop]"
    return words


def stop_units(units, result, run_command, which, proc="/proc"):
    """`systemctl stop` each unit of `units`, before the PIDs are ended; note in result["unit_processes"] which of its
    processes the stop ended ("ended"). Returns a failure message, or None."""
    systemctl = which("systemctl") if units else None
    if units and not systemctl:
        return "stop_owners: systemctl is not on this host, so units %s cannot be stopped; nothing was signalled" % (
            ", ".join(units)
        )
    for unit in units:
        rc, _out, err = run_command([systemctl, "stop", unit])
        if rc != 0:
            return "systemctl stop %s failed (rc %s): %s; nothing was signalled" % (
                unit,
                rc,
                err.strip() or "no error text",
            )
        result["stopped_units"].append(unit)
        for process in result["unit_processes"].get(unit, []):
            process["ended"] = not _proc.ProcessId(process["pid"], process["start_ticks"]).alive(proc)
    result["changed"] = result["changed"] or bool(units)
    return None


def owner_commands(targets):
    """The commands that stop the containers and pods of the targets (reported, never run)."""
    return sorted(
        {
            _owners.stop_command(t["owner"])
            for t in targets
            if (t.get("owner") or {}).get("container_id") or (t.get("owner") or {}).get("pod_uid")
        }
    )
