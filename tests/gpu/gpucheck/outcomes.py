# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the collection's playbooks did to the check's processes, read from the modules' results (pure functions).

check_gpus is gpu_wait (return_after false): per GPU, the selected `holders`, the `left_alone` holders and the
`suspects` it names. reset_gpus is gpu_kill: `would_signal` in check mode, `signalled` otherwise. The check's
processes are {name: PID}; each function says which of them a result names.
"""

from __future__ import annotations


def named_by_check(wait_result, index):
    """{"holders", "left_alone", "suspects"}: PIDs check_gpus (gpu_wait's result) names on GPU `index`, sorted."""
    named = {"holders": set(), "left_alone": set(), "suspects": set()}
    for gpu in wait_result.get("gpus") or []:
        if gpu.get("index") != index:
            continue
        named["holders"].update(item["pid"] for item in gpu.get("holders") or [])
        named["left_alone"].update(item["pid"] for item in gpu.get("left_alone") or [])
        named["suspects"].update(gpu.get("suspects") or [])
    return {key: sorted(pids) for key, pids in named.items()}


def signalled_by_reset(kill_result):
    """PIDs reset_gpus' gpu_kill signalled, or in check mode would signal, sorted."""
    items = (kill_result.get("signalled") or []) + (kill_result.get("would_signal") or [])
    return sorted({item["pid"] for item in items})


def names_of(pids, ours):
    """The names of our processes ({name: PID}) among `pids`, sorted; PIDs of others as "PID N"."""
    by_pid = {pid: name for name, pid in ours.items()}
    return sorted(by_pid.get(pid, "PID %d" % pid) for pid in pids)


def exactly(pids, targets, ours):
    """(whether, of our processes `ours`, exactly `targets` (names) are among `pids`; the names found there).
    PIDs that are not ours do not count against it (the check runs beside whatever else the host runs)."""
    found = [name for name in names_of(pids, ours) if name in ours]
    return sorted(found) == sorted(targets), found
