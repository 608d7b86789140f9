# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Waiting until GPUs are released: no holder left and memory used at or below a threshold.

The driver frees a dead process's memory some time after its last handle closes (about
0.5 s for device memory, tens of seconds with large pinned host memory, never when a thread
is stuck in the driver). So the wait polls, it never sleeps a fixed time. The words of a wait that did not end
with its GPUs free, and the operator's next step, are `_advice`'s.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options, _release, _shapes

if TYPE_CHECKING:
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._gpus import Inspector
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._select import Selection

# Each NVML query may take the time left before the timeout plus this much (seconds): a healthy
# driver answers in milliseconds, a hung one is given up on at most this long after the timeout.
NVML_SLACK_S = 1.0
# The time phrase a wait's message begins with (conclude): "released after 0.52 s", "no holder left (memory not
# checked: no driver) after 0.52 s", "not released after 1.5 s".
_TIMED = re.compile(r"^(not released|released|no holder left \(memory not checked: [^)]*\)) after [0-9.]+ s")
# The wait's options, shared by gpu_wait and gpu_kill (wait=true).
WAIT_ARGS = _options.spec(_options.GPU, "max_used_mib", "poll_interval")


def wait_released(
    inspector: Inspector,
    selection: Selection,
    timeout: float,
    max_used_mib: int,
    poll_interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
    first: Optional[_shapes.Snapshot] = None,
) -> _shapes.Waited:
    """Poll snapshots until every GPU `selection` (a _select.Selection) selects is released or `timeout` seconds pass.

    Returns {"released" (bool), "elapsed_s", "polls", "gpus" (_release.gpu_status of the last poll),
    "driver" (the last snapshot's driver state), "snapshot" (the last snapshot itself)}. A driver that stops answering
    ends the wait at once with released=False, and so do selected GPUs that the driver answers with an error (a lost
    GPU) once they are all that is left: waiting cannot change them, while the other GPUs may still release (the NVML
    query is bounded by the time left plus NVML_SLACK_S).
    Each look scans only the PIDs the driver lists while their memory explains the selected GPUs. `first`, a
    snapshot just taken (by a caller that ended nothing since), serves as the first look.
    """
    start = clock()
    deadline = start + timeout
    polls = 0
    while True:
        polls += 1
        # A hung driver may delay the last look by at most NVML_SLACK_S beyond `timeout`.
        if first is not None:
            snapshot, first = first, None
        else:
            snapshot = inspector.snapshot(
                timeout=max(0.0, deadline - clock()) + NVML_SLACK_S,
                scope="listed",
                indices=selection.indices,
                tolerance_mib=max_used_mib,
                owners=bool(selection.owners),
            )
        status = _release.gpu_status(selection, snapshot, max_used_mib)
        done = all(gpu["released"] for gpu in status)
        now = clock()
        # Waiting cannot help a hung driver, nor GPUs that answer with an error or that only the memory of protected
        # holders keeps (nothing ends them); the others are still waited for.
        pending = [gpu for gpu in status if not gpu["released"]]
        hopeless = snapshot["driver"]["timed_out"] or (
            pending and all(gpu.get("error") or _release.held_by_protected(gpu, max_used_mib) for gpu in pending)
        )
        if done or now >= deadline or hopeless:
            return {
                "released": done and not snapshot["driver"]["timed_out"],
                "elapsed_s": round(now - start, 3),
                "polls": polls,
                "gpus": status,
                "driver": snapshot["driver"],
                "snapshot": snapshot,
            }
        sleep(min(poll_interval, max(0.0, deadline - now)))


def conclude(result: _shapes.Waited, driver_timeout: float, single_look: bool = False) -> str:
    """Complete a wait_released() result for a module: "memory_checked", "left_alone" (one entry per GPU a left-alone
    holder holds), "next_step" on each GPU not released; return the message (one line per GPU that is not released,
    saying why and what to do next; never None or empty lists)."""
    driver = result["driver"]
    result["memory_checked"] = all(gpu["memory_checked"] for gpu in result["gpus"])
    result["left_alone"] = [dict(h, gpu=gpu["index"]) for gpu in result["gpus"] for h in gpu["left_alone"]]
    left = left_alone_words(result["left_alone"])
    if result["released"]:
        what = "released"
        if not result["memory_checked"]:
            why = "the driver does not report it" if driver["available"] else "no driver"
            what = "no holder left (memory not checked: %s)" % why
        return after(what, result["elapsed_s"]) + left
    # The words of GPUs not released: imported only for them (a module compiles every module_utils it imports).
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _advice

    stuck = [gpu for gpu in result["gpus"] if not gpu["released"]]
    for gpu in stuck:
        gpu["next_step"] = _advice.next_step(gpu, driver)
    if driver["timed_out"]:
        return (
            # What NVML raised (driver.error) is in the result: it would say the same again ("did not return").
            "NVML did not answer within driver_timeout (%s s): the driver may be hung; GPU memory release could not "
            "be confirmed%s. Next: look for Xid errors in the kernel log (dmesg) and check nvidia-smi; a hung driver "
            "needs a GPU reset or a reboot" % (driver_timeout, _advice.found_by_scan(stuck))
        )
    return "%s: %s%s" % (
        "not free" if single_look else after("not released", result["elapsed_s"]),
        "; ".join(_advice.describe(gpu) for gpu in stuck),
        left,
    )


def left_alone_words(left_alone: Iterable[Mapping[str, Any]]) -> str:
    """The clause of a wait's message naming the holders it left alone ("" where none): "; left alone: PID 7 (vllm,
    excluded by name)"."""
    named = {"PID %s (%s, %s)" % (h["pid"], h["comm"], h["reason"]) for h in left_alone}
    return "; left alone: %s" % ", ".join(sorted(named)) if named else ""


def after(what: str, elapsed_s: float) -> str:
    """The time phrase of a wait's message: "WHAT after N s", N in seconds with one decimal for "not released", two
    for the rest ("released", "no holder left (memory not checked: ...)")."""
    return "%s after %s s" % (what, ("%.1f" if what == "not released" else "%.2f") % elapsed_s)


def whole_time(msg: str, elapsed_s: float) -> str:
    """`msg`, a wait's message (conclude), with the seconds of its first phrase replaced by `elapsed_s`: the whole
    time of a wait in several slices (gpu_wait's progress_interval, the reset_gpus role), where each slice's message
    counts that slice only. A message without such a phrase (a hung driver, a refusal) is returned unchanged."""
    return _TIMED.sub(lambda found: after(found.group(1), elapsed_s), msg, count=1)


def worth_another_slice(
    last: Mapping[str, Any], waited_s: float, timeout_s: float, slice_s: Optional[float] = None
) -> bool:
    """Whether a wait in slices goes on after the slice `last` (a gpu_wait result, or gpu_kill's own wait with its
    "released"), with `waited_s` seconds waited in all slices so far and `timeout_s` for the whole wait.

    Yes only while the slice ended with the GPUs still held ("released" false), waiting can help (the driver answered;
    some GPU not released answers without an error: a lost GPU never comes back), the slice took time (a slice that
    ended at its first look ended because waiting cannot help) and time is left. `slice_s`, where given, is the
    slice's own timeout (seconds): a slice that ended more than a millisecond before it ended because waiting cannot
    help (GPUs that only the memory of protected holders keeps). Used by gpu_wait's action plugin and the reset_gpus
    role (plugins/filter/reports/reports.py, reset_gpus_state)."""
    elapsed = float(last.get("elapsed_s") or 0)
    return bool(
        "released" in last
        and not last["released"]
        and not (last.get("driver") or {}).get("timed_out")
        and any(not gpu.get("released") and not gpu.get("error") for gpu in last.get("gpus") or ())
        and elapsed > 0
        and (slice_s is None or elapsed >= slice_s - 0.001)
        and waited_s < timeout_s
    )
