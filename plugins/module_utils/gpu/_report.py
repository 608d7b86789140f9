# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The per-host summary of a reset, in words. Never prints None: unknown memory, names and GPUs are said in words.
gpu_kill builds it where its run finishes the reset; the reset_gpus role builds it with the same functions on the
controller after a longer wait, a failed kill or in check mode (plugins/filter/reports/reports.py). The owner of each holder
is said in the words of _owners.owner_words; where ending the PID alone will not last, the owner's note and the command
that stops it follow on the next line (_owner_lines.owner_line)."""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owner_lines, _release, _shapes, _wait

# Command lines in the summary are cut to this many characters, "..." included.
_CMDLINE_WIDTH = 80


def cut_cmdline(text: Optional[str]) -> str:
    text = text or ""
    return text if len(text) <= _CMDLINE_WIDTH else text[: _CMDLINE_WIDTH - 3] + "..."


def where(process: Mapping[str, Any]) -> str:
    """The GPUs a holder holds, in words."""
    if process.get("gpus"):
        return "GPUs " + ",".join(str(i) for i in process["gpus"])
    if process.get("minors"):
        return "/dev/nvidia" + ",/dev/nvidia".join(str(m) for m in process["minors"]) + ", GPU index unknown"
    return "no single GPU"


def annotate(process: Dict[str, Any], stop_timeout_s: Optional[float] = None) -> Dict[str, Any]:
    """Add to a selected holder, from its `owner` block (_owners.owner_of): "owner_note" (why ending the PID alone will
    not last, or None), "owner_command" (the command that stops the owner, or None; a container's runtime stop with
    `stop_timeout_s` seconds before SIGKILL) and "owner_label" (the Prometheus label value, "" when no owner is
    known). Returns the process."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners

    owner = process.get("owner")
    process["owner_note"] = _owners.restart_note(owner)
    process["owner_command"] = _owners.stop_command(owner, stop_timeout_s)
    process["owner_label"] = _owners.owner_label(owner)
    return process


def place(process: Mapping[str, Any]) -> str:
    """Where a holder is and what owns it: "GPUs 0, unit vllm@a.service"."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners

    words = _owners.owner_words(process.get("owner"))
    return where(process) + (", " + words if words else "")


def _mib(value: Optional[int]) -> str:
    return "unknown" if value is None else str(value)


def outcome(kill: Mapping[str, Any], wait: Mapping[str, Any], check_mode: bool, waited_s: float) -> str:
    """What the run came to, in one sentence (the summary's line and the JSON report's message), with the whole time
    waited `waited_s` (seconds, all slices of the wait: a failed wait's message counts its last slice only)."""
    if check_mode:
        if kill.get("failed"):
            return "FAILED (check mode): %s" % kill.get("msg", "gpu_kill did not run")
        return "check mode: would signal %d process(es), nothing was signalled%s" % (
            len(kill.get("would_signal", [])),
            would_stay_words(kill),
        )
    if kill.get("failed") and not kill.get("wait_timed_out"):
        return "FAILED to end the holders: %s" % kill.get("msg", "gpu_kill did not run")
    if wait.get("released"):
        if wait.get("memory_checked", True):
            kept = sum(gpu.get("left_alone_mib") or 0 for gpu in wait.get("gpus") or ())
            if kept:
                # Released means: nothing selected holds the GPUs any more. What the holders left alone hold stays.
                return "memory released after %.2f s more, besides %d MiB that left-alone processes hold%s" % (
                    waited_s,
                    kept,
                    kept_words(wait.get("gpus")),
                )
            return "memory released after %.2f s more" % waited_s
        return "no holder left after %.2f s more; used memory not checked (%s)" % (
            waited_s,
            "the driver does not report it"
            if (wait.get("driver") or {}).get("available")
            else "NVIDIA driver library not usable",
        )
    return "FAILED: %s" % _wait.whole_time(wait.get("msg", "the wait did not run"), waited_s)


def would_stay_words(kill: Mapping[str, Any]) -> str:
    """The clause of a check-mode message that names the selected GPUs no target holds that are not free (gpu_kill's
    "would_stay"); "" where there are none."""
    if not kill.get("would_stay"):
        return ""
    return (
        "; ending the holders would not free these GPUs, and a real run would wait its whole timeout for them unless "
        "the driver frees their memory first: %s" % kill["would_stay"]
    )


def kept_words(gpus: Optional[Iterable[Mapping[str, Any]]]) -> str:
    """Who keeps the memory that the holders left alone hold on each GPU of a wait's last status (_shapes.WaitStatus),
    as a clause: " (GPU 1: 11626 MiB with PID 17, 18, 23, 24, which hold the contexts of PID 16, 22, exited)"; ""
    where the entries do not name them."""
    parts = []
    for gpu in gpus or ():
        mib = gpu.get("left_alone_mib") or 0
        kept = gpu.get("kept") or {}
        pids = sorted(
            {h["pid"] for h in gpu.get("left_alone") or () if not h.get("counted") and h.get("memory_mib")}
            | set(kept.get("holders") or () if kept.get("creators") else ())
        )
        if mib <= 0 or not pids:
            continue
        whose = ""
        if kept.get("creators"):
            whose = ", which hold the contexts of PID %s, exited" % ", ".join(str(p) for p in kept["creators"])
        parts.append("GPU %s: %d MiB with PID %s%s" % (gpu.get("index"), mib, ", ".join(str(p) for p in pids), whose))
    return " (%s)" % "; ".join(parts) if parts else ""


def _inheriting(processes: Iterable[Mapping[str, Any]], index: object) -> List[int]:
    """The PIDs of `processes` (holders) that hold GPU `index` through an exited creator's context."""
    return [p["pid"] for p in processes if (p.get("attribution") or {}).get(str(index)) == "device_file"]


def shared_lines(kill: Mapping[str, Any], before: _shapes.Snapshot, check_mode: bool) -> List[str]:
    """A line per selected holder group that shares an exited creator's context with a holder left alone (before the
    run's end, `before`): ending the selected ones frees nothing of it; it stays until the last of them exits."""
    ended = kill.get("would_signal" if check_mode else "signalled") or []
    left = kill.get("left_alone") or []
    lines = []
    for gpu in before.get("gpus") or ():
        exited = gpu.get("exited") or []
        staying = _inheriting(left, gpu["index"])
        kept = _release.kept_contexts(exited, gpu.get("context_groups"), _inheriting(ended, gpu["index"]), staying)
        creators = ", ".join(str(pid) for pid in sorted(item["pid"] for item in exited))
        whose = "PID %s's context (exited)" if len(exited) == 1 else "the context of an exited creator (one of PID %s)"
        for group in kept["shared"] if kept else ():
            stay = ", ".join(str(pid) for pid in group if pid in staying)
            lines.append(
                "  GPU %s: PID %s %s %s with PID %s, left alone: that context and its memory stay until PID %s exit%s"
                % (
                    gpu["index"],
                    ", ".join(str(pid) for pid in group if pid not in staying),
                    "would share" if check_mode else "shared",
                    whose % creators,
                    stay,
                    stay,
                    "" if "," in stay else "s",
                )
            )
    return lines


def _seconds_words(value: object, rounded: bool = False) -> str:
    """Seconds without a needless ".0": as given (120, 1.5, 104.988) or, `rounded` for seconds that come from
    arithmetic (a time left), whole from 10 s on and with at most one decimal below (116, 9.5): a whole timeout, or one
    with a tenth below 10 s, still reads as given."""
    try:
        seconds = float(value)  # type: ignore[arg-type]  # anything: what float() refuses is shown as it is
    except (TypeError, ValueError):
        return str(value)
    if not rounded:
        return "%g" % seconds
    tenths = 10 if abs(seconds) < 10 else 1
    return "%g" % (math.floor(seconds * tenths + 0.5) / tenths)  # half up: 30.5 reads 31, as one reads it


def held_words(gpus: Optional[Iterable[Mapping[str, Any]]]) -> str:
    """Each GPU of `gpus` (a slice's per-GPU status, _shapes.WaitStatus) still held: its used memory (MiB, or why it is
    unknown), the PIDs that hold it and the memory of protected holders; "; " between two GPUs."""
    parts = []
    for gpu in gpus or ():
        if gpu.get("released"):
            continue
        used = gpu.get("memory_used_mib")
        error = gpu.get("error")
        protected = gpu.get("protected_mib") or 0
        kept = gpu.get("left_alone_mib") or 0
        parts.append(
            "%s %s%s%s, held by %s%s"
            % (
                "all GPUs" if gpu.get("index") is None else "GPU %s" % gpu["index"],
                "used memory unknown" if used is None else "%s MiB used" % used,
                " (%s)" % error if error else "",
                " (%s MiB of it kept by holders left alone)" % kept if kept and used is not None else "",
                ", ".join(str(holder["pid"]) for holder in gpu.get("holders") or ()) or "no selected process",
                ", %s MiB by protected holders" % protected if protected else "",
            )
        )
    return "; ".join(parts)


def progress_line(gpus: Optional[Iterable[Mapping[str, Any]]], waited_s: float, timeout_s: object) -> str:
    """The line of progress of a wait in slices, printed by gpu_wait's action plugin between two slices: the seconds
    waited so far (`waited_s`) of `timeout_s` (rounded: the reset_gpus role gives gpu_wait the rest of its wait, such
    as 115.995), and what still holds each GPU of `gpus` (held_words)."""
    return "still waiting after %.0f s of %s s: %s" % (
        waited_s or 0,
        _seconds_words(timeout_s, rounded=True),
        held_words(gpus),
    )


def first_progress_line(
    gpus: Optional[Iterable[Mapping[str, Any]]], waited_s: float, timeout_s: object, left_s: float
) -> str:
    """The line the reset_gpus role prints after gpu_kill's slice of `waited_s` seconds, before gpu_wait waits for the
    rest of `timeout_s`, `left_s` seconds: what still holds each GPU of `gpus` (held_words) and how long the wait may go
    on. gpu_wait's own lines (progress_line) then count within that rest."""
    return "still held after %.0f s of %s s: %s; waiting up to %s s more" % (
        waited_s or 0,
        _seconds_words(timeout_s),
        held_words(gpus),
        _seconds_words(left_s, rounded=True),
    )


def summary_lines(
    kill: Mapping[str, Any], before: _shapes.Snapshot, after: _shapes.Snapshot, check_mode: bool, message: str
) -> List[str]:
    """The summary: what was (or would be) signalled and left alone, the outcome `message`, and per selected GPU
    its used memory and holder count before -> after."""
    lines: List[str] = []
    stopped = _owner_lines.stopped_names(kill)

    def add_owner_line(process: Mapping[str, Any]) -> None:
        line = _owner_lines.owner_line(process, stopped)
        if line:
            lines.append(line)

    if check_mode:
        lines.append(message)
        for p in kill.get("would_signal", []):
            lines.append(
                "  would signal PID %s %s (%s): %s" % (p["pid"], p["comm"], place(p), cut_cmdline(p.get("cmdline")))
            )
            add_owner_line(p)
        lines.extend(_owner_lines.unit_lines(kill, check_mode))
    else:
        lines.append("signalled %d process(es) in %.2f s" % (len(kill.get("signalled", [])), kill.get("elapsed_s", 0)))
        lines.extend(_owner_lines.unit_lines(kill, check_mode))
        for p in kill.get("signalled", []):
            lines.append(
                "  PID %s %s (%s): %s, %s"
                % (
                    p["pid"],
                    p["comm"],
                    place(p),
                    " then ".join(p["signals"]),
                    "exited after %.2f s" % p["exited_after_s"] if "exited_after_s" in p else "did not exit",
                )
            )
            add_owner_line(p)
        lines.extend(
            "  PID %s %s (%s): not signalled, %s" % (p["pid"], p["comm"], place(p), p["reason"])
            for p in kill.get("not_signalled", [])
        )
    lines.extend("  left alone PID %s %s: %s" % (p["pid"], p["comm"], p["reason"]) for p in kill.get("left_alone", []))
    lines.extend(shared_lines(kill, before, check_mode))
    if kill.get("not_holding"):
        lines.append(
            "  PID(s) %s from pids hold none of the selected GPUs (or do not exist): not signalled"
            % ", ".join(str(pid) for pid in kill["not_holding"])
        )
    lines.extend(_owner_lines.beyond_lines(kill, check_mode))
    if not check_mode:
        lines.append(message)
    if not before["driver"]["available"]:
        lines.append(
            "NVIDIA driver library not usable (%s): holders from the /proc scan alone; used memory not checked"
            % (before["driver"].get("error") or "no error given")
        )
    lines.extend(_gpu_lines(kill.get("gpus"), before, after))
    return lines


def _gpu_lines(selected: Optional[Sequence[int]], before: _shapes.Snapshot, after: _shapes.Snapshot) -> List[str]:
    """Per GPU of `selected` (None: every GPU), its used memory and holder count before -> after."""
    lines: List[str] = []
    after_by_index = {gpu["index"]: gpu for gpu in after["gpus"]}
    for gpu in before["gpus"]:
        if selected is not None and gpu["index"] not in selected:
            continue
        later: Mapping[str, Any] = after_by_index.get(gpu["index"]) or {}
        problem = later.get("error") or gpu.get("error")
        if "process_lists" in (gpu.get("memory_source"), later.get("memory_source")):
            # A GB10: NVML reports no memory; the figure is what its process lists charge.
            memory = "used memory not reported by the driver (its process lists charge %s -> %s MiB)" % (
                _mib(gpu["memory_used_mib"]),
                _mib(later.get("memory_used_mib")),
            )
        elif gpu["memory_used_mib"] is None and later.get("memory_used_mib") is None:
            memory = "used memory unknown"
        else:
            memory = "%s -> %s MiB used" % (_mib(gpu["memory_used_mib"]), _mib(later.get("memory_used_mib")))
        lines.append(
            "GPU %s%s: %s%s, holders %d -> %s"
            % (
                gpu["index"],
                " %s" % gpu["name"] if gpu.get("name") else "",
                memory,
                " (%s)" % problem if problem else "",
                len(gpu["holder_pids"]),
                len(later["holder_pids"]) if "holder_pids" in later else "unknown",
            )
        )
    return lines
