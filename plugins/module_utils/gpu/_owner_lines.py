# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The words of what stop_owners stopped (or would stop) and of owners that start a holder again: the lines of
gpu_kill's message and summary (_kill, _report).

Apart from _stop_owners, which plans and runs the stops: every gpu_kill run says these lines, most (a clean host)
with nothing in them, and a module compiles every module_utils it imports (Ansible ships them as source).
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Optional, Tuple


def gpu_words(process: Mapping[str, Any]) -> str:
    """The GPUs a process holds: "holds GPU 4", "holds GPUs 0, 1", "holds no GPU"."""
    gpus = process["gpus"]
    if not gpus:
        return "holds no GPU"
    return "holds GPU%s %s" % ("s" if len(gpus) > 1 else "", ", ".join(str(g) for g in gpus))


def process_words(process: Mapping[str, Any]) -> str:
    """ "PID 8 (python3) holds GPU 4, outside the selection"; "PID 9 (cron) holds no GPU"."""
    words = "PID %s (%s) %s" % (process["pid"], process["comm"], gpu_words(process))
    return words if process["reason"] == "holds no GPU" else "%s, %s" % (words, process["reason"])


def beyond_words(item: Mapping[str, Any], check_mode: bool) -> str:
    """An owner that stop_owners stops (or reports) and its processes beyond the selection, in words:
    "stopped systemd unit vllm@a.service, and with it, beyond the selection: PID 8 (python3) holds GPU 4, outside
    the selection"."""
    if item["kind"] == "unit" or item.get("stops"):
        what = "would stop" if check_mode else "stopped"
    else:
        what = "%s (reported, not run) would stop" % item["command"]
    return "%s %s, and with it, beyond the selection: %s" % (
        what,
        item["owner"],
        ", ".join(process_words(p) for p in item["processes"]),
    )


def beyond_lines(kill: Mapping[str, Any], check_mode: bool) -> List[str]:
    """The summary's lines of the owners that reach beyond the selection (beyond_words), but for a unit whose every
    process unit_lines names already."""
    named = {unit for unit, processes in (kill.get("unit_processes") or {}).items() if processes}
    inside = kill.get("container_processes") or {}
    containers = kill.get("would_stop_containers", []) if check_mode else kill.get("stopped_containers", [])
    named_commands = {c["command"] for c in containers if inside.get(c["id"])}
    return [
        "  " + beyond_words(item, check_mode)
        for item in kill.get("owners_beyond_selection", [])
        if item.get("unit") not in named and not (item["kind"] == "container" and item["command"] in named_commands)
    ]


def unit_lines(kill: Mapping[str, Any], check_mode: bool) -> List[str]:
    """The summary's lines of the units stop_owners stops (or would), each with every process the stop ends:
    "  stopped systemd unit cron.service first (stop_owners), ending PID 5 cron (holds no GPU, beyond the selection),
    PID 9 python3 (holds GPU 4, selected)"."""
    units = kill.get("would_stop_units", []) if check_mode else kill.get("stopped_units", [])
    lines = []
    for unit in units:
        line = "  %s systemd unit %s first (stop_owners)" % ("would stop" if check_mode else "stopped", unit)
        lines.append(line + _ending((kill.get("unit_processes") or {}).get(unit), check_mode))
    return lines + container_lines(kill, check_mode)


def _ending(processes: Optional[List[Mapping[str, Any]]], check_mode: bool) -> str:
    """What a stop ends, after the owner's words: ", ending PID ..." (check mode), ", which ended PID ...", or that its
    processes could not be read; "" where the stop was not planned with them."""
    if processes:
        verb = "ending" if check_mode else "which ended"
        return ", %s %s" % (verb, ", ".join(_member_words(p, check_mode) for p in processes))
    return "; its processes could not be read before the stop" if processes is not None else ""


def container_lines(kill: Mapping[str, Any], check_mode: bool) -> List[str]:
    """The summary's lines of the containers stop_owners stops (or would), each with its command and every process
    the stop ends: "  stopped podman container 4f1c3a9e0b7d first (stop_owners: podman stop -t 30 4f1c3a9e0b7d),
    which ended PID 7 VLLM::Worker_TP (holds GPU 0, selected), ..."."""
    containers = kill.get("would_stop_containers", []) if check_mode else kill.get("stopped_containers", [])
    if not containers:
        return []
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners

    lines = []
    for container in containers:
        line = "  %s %s container %s first (stop_owners: %s)" % (
            "would stop" if check_mode else "stopped",
            container["runtime"],
            container["id"][: _owners.CONTAINER_PREFIX_MIN],
            container["command"],
        )
        lines.append(line + _ending((kill.get("container_processes") or {}).get(container["id"]), check_mode))
    return lines


def _member_words(process: Mapping[str, Any], check_mode: bool) -> str:
    why = "beyond the selection" if process["why"] == "holds no GPU" else process["why"]
    words = "PID %s %s (%s, %s)" % (process["pid"], process["comm"], gpu_words(process), why)
    if not check_mode and process.get("ended") is False:
        words += " [still running after the stop]"
    return words


def stopped_names(kill: Mapping[str, Any]) -> List[str]:
    """The units and the container stop commands that this run stopped (owner_left_running's `stopped_units`)."""
    return list(kill.get("stopped_units", [])) + [c["command"] for c in kill.get("stopped_containers", [])]


def owner_left_running(process: Mapping[str, Any], stopped_units: Iterable[str]) -> Optional[Tuple[str, Optional[str]]]:
    """(why ending `process` alone will not last, the command that stops its owner or None), or None: none when
    nothing starts it again, or when this run stopped its unit (stop_owners). `process` is a holder that
    _report.annotate annotated ("owner_note", "owner_command"). The one rule of owner_warning and owner_line."""
    note = process.get("owner_note")
    command = process.get("owner_command")
    stopped = set(stopped_units)
    if not note or command in stopped or command in {"systemctl stop %s" % unit for unit in stopped}:
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
