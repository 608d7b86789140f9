# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The per-host summary of a reset, in words, built where the data is (the module) rather than in a template
rendered on the controller for every host. Never prints None: unknown memory, names and GPUs are said in words.
The reset_gpus role prints these lines on its common path (roles/reset_gpus/templates/summary.j2 says the same
after a long wait)."""
from __future__ import annotations

# Jinja's truncate(80, true), which the role's template uses: strings up to 80 + 5 (leeway) are kept.
_CMDLINE_WIDTH = 80
_CMDLINE_LEEWAY = 5


def _cut(text):
    text = text or ""
    return text if len(text) <= _CMDLINE_WIDTH + _CMDLINE_LEEWAY else text[:_CMDLINE_WIDTH - 3] + "..."


def where(process):
    """The GPUs a holder holds, in words."""
    if process.get("gpus"):
        return "GPUs " + ",".join(str(i) for i in process["gpus"])
    if process.get("minors"):
        return "/dev/nvidia" + ",/dev/nvidia".join(str(m) for m in process["minors"]) + ", GPU index unknown"
    return "no single GPU"


def _mib(value):
    return "unknown" if value is None else str(value)


def outcome(kill, wait, check_mode, waited_s):
    """What the run came to, in one sentence (the summary's line and the JSON report's message)."""
    if check_mode:
        return "check mode: would signal %d process(es), nothing was signalled" % len(kill.get("would_signal", []))
    if kill.get("failed") and not kill.get("wait_timed_out"):
        return "FAILED to end the holders: %s" % kill.get("msg", "gpu_kill did not run")
    if wait.get("released"):
        if wait.get("memory_checked", True):
            return "memory released after %.2f s more" % waited_s
        return "no holder left after %.2f s more; used memory not checked (NVIDIA driver library not usable)" % waited_s
    return "FAILED: %s" % wait.get("msg", "the wait did not run")


def summary_lines(kill, before, after, check_mode, message):
    """The summary: what was (or would be) signalled and left alone, the outcome `message`, and per selected GPU
    its used memory and holder count before -> after."""
    lines = []
    if check_mode:
        lines.append(message)
        lines.extend("  would signal PID %s %s (%s): %s" % (p["pid"], p["comm"], where(p), _cut(p.get("cmdline")))
                     for p in kill.get("would_signal", []))
    else:
        lines.append("signalled %d process(es) in %.2f s" % (len(kill.get("signalled", [])), kill.get("elapsed_s", 0)))
        for p in kill.get("signalled", []):
            lines.append("  PID %s %s (%s): %s, %s" % (
                p["pid"], p["comm"], where(p), " then ".join(p["signals"]),
                "exited after %.2f s" % p["exited_after_s"] if "exited_after_s" in p else "did not exit"))
    lines.extend("  left alone PID %s %s: %s" % (p["pid"], p["comm"], p["reason"]) for p in kill.get("left_alone", []))
    if not check_mode:
        lines.append(message)
    if not before["driver"]["available"]:
        lines.append("NVIDIA driver library not usable (%s): holders from the /proc scan alone; used memory not checked"
                     % (before["driver"].get("error") or "no error given"))
    selected = kill.get("gpus")
    after_by_index = {gpu["index"]: gpu for gpu in after["gpus"]}
    for gpu in before["gpus"]:
        if selected is not None and gpu["index"] not in selected:
            continue
        later = after_by_index.get(gpu["index"], {})
        problem = later.get("error") or gpu.get("error")
        if gpu["memory_used_mib"] is None and later.get("memory_used_mib") is None:
            memory = "used memory unknown"
        else:
            memory = "%s -> %s MiB used" % (_mib(gpu["memory_used_mib"]), _mib(later.get("memory_used_mib")))
        lines.append("GPU %s%s: %s%s, holders %d -> %s" % (
            gpu["index"], " " + gpu["name"] if gpu.get("name") else "", memory, " (%s)" % problem if problem else "",
            len(gpu["holder_pids"]), len(later["holder_pids"]) if "holder_pids" in later else "unknown"))
    return lines
