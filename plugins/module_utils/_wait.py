# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Waiting until GPUs are released: no holder left and memory used at or below a threshold.

The driver frees a dead process's memory some time after its last handle closes (about
0.5 s for device memory, tens of seconds with large pinned host memory, never when a thread
is stuck in the driver). So the wait polls, it never sleeps a fixed time.
"""
from __future__ import annotations

import time

from ansible_collections.gpuops.nvidia.plugins.module_utils import _gpus

# Default threshold: NVML v2 `used` excludes reserved memory, so an idle GPU reports a few MiB;
# 256 MiB tolerates idle usage and small driver allocations, and no CUDA context is that small.
DEFAULT_MAX_USED_MIB = 256
# Each NVML query may take the time left before the timeout plus this much (seconds): a healthy
# driver answers in milliseconds, a hung one is given up on at most this long after the timeout.
NVML_SLACK_S = 1.0
# Seconds between two looks: a look costs a few ms on a node with a few hundred processes.
DEFAULT_POLL_INTERVAL_S = 0.02


def gpu_status(view, indices, max_used_mib, own_chain, exclude=(), include_protected=False):
    """Per selected GPU: is it released? Returns [{"index", "memory_used_mib", "memory_reserved_mib",
    "unexplained_mib", "holders" ([{pid, comm, state, cmdline, memory_mib}]), "released" (bool),
    "memory_checked" (False when NVML could not be asked)}].

    Protected daemons (nvidia-persistenced, DCGM...) and our own process chain do not count
    as holders: they hold the device files on healthy GPUs too.
    """
    status = []
    wanted = None if indices is None else set(indices)
    by_index = {gpu["index"]: gpu for gpu in view["gpus"]}
    counted = [h for h in view["holders"]
               if not h["control_only"] and _gpus.protection(h, own_chain, exclude, include_protected) is None]
    if not view["gpus"]:
        # No index map (no NVML, no /proc/driver/nvidia): one entry for "all GPUs", from /proc alone.
        return [{"index": None, "memory_used_mib": None, "memory_reserved_mib": None, "unexplained_mib": None,
                 "holders": [_brief(h, None) for h in counted], "memory_checked": False, "released": not counted}]
    for index in sorted(by_index):
        if wanted is not None and index not in wanted:
            continue
        gpu = by_index[index]
        holders = [_brief(h, index) for h in counted if index in h["gpus"]]
        used = gpu["memory_used_mib"]
        checked = used is not None
        # A GPU the driver answers with an error (lost, fallen off the bus) is never "released":
        # its memory cannot be checked, and its holders may not be mapped to it.
        status.append({
            "index": index, "uuid": gpu.get("uuid"), "memory_used_mib": used,
            "memory_reserved_mib": gpu["memory_reserved_mib"], "unexplained_mib": gpu["unexplained_mib"],
            "holders": holders, "memory_checked": checked, "error": gpu.get("error"),
            "released": not holders and not gpu.get("error") and (not checked or used <= max_used_mib),
        })
    return status


def _brief(holder, index):
    memory = holder["memory_mib"].get(str(index)) if index is not None else None
    return {"pid": holder["pid"], "comm": holder["comm"], "state": holder["state"], "cmdline": holder["cmdline"],
            "user": holder["user"], "memory_mib": memory}


def next_step(gpu):
    """What an operator can do about a GPU that was not released (one sentence)."""
    if gpu.get("error"):
        return ("NVML answers this GPU with an error (%s): it may have fallen off the bus (see Xid errors in dmesg); "
                "reset it (nvidia-smi --gpu-reset -i %s) or reboot the host" % (gpu["error"], gpu["index"]))
    if any(h["state"] == "D" for h in gpu["holders"]):
        return ("a holder is in uninterruptible sleep (D), stuck in the driver: SIGKILL cannot end it; "
                "reset the GPU (nvidia-smi --gpu-reset -i %s) or reboot the host" % gpu["index"])
    if gpu["holders"]:
        return "processes still hold the GPU: end them with gpuops.nvidia.gpu_kill (or check why they restart)"
    if gpu["memory_checked"]:
        return ("memory is used but no process here holds the GPU (a leaked context, or a holder in a PID namespace "
                "this host cannot see): wait longer, or reset the GPU (nvidia-smi --gpu-reset -i %s, needs no client "
                "on the device, nvidia-persistenced included) or reboot" % gpu["index"])
    return "the driver did not report memory; check the NVIDIA driver (nvidia-smi)"


def wait_released(inspector, indices, timeout, max_used_mib=DEFAULT_MAX_USED_MIB, poll_interval=DEFAULT_POLL_INTERVAL_S,
                  exclude=(), include_protected=False, clock=time.monotonic, sleep=time.sleep):
    """Poll snapshots until every selected GPU is released or `timeout` seconds pass.

    Returns {"released" (bool), "elapsed_s", "polls", "gpus" (gpu_status of the last poll),
    "driver" (the last snapshot's driver state), "view" (the last snapshot itself)}. A driver that stops answering ends the
    wait at once with released=False (its NVML query is bounded by the time left plus NVML_SLACK_S).
    """
    own_chain = _gpus.ancestors()
    start = clock()
    deadline = start + timeout
    polls = 0
    while True:
        polls += 1
        # A hung driver may delay the last look by at most NVML_SLACK_S beyond `timeout`.
        view = inspector.snapshot(timeout=max(0.0, deadline - clock()) + NVML_SLACK_S)
        status = gpu_status(view, indices, max_used_mib, own_chain, exclude, include_protected)
        done = all(gpu["released"] for gpu in status)
        now = clock()
        if done or now >= deadline or view["driver"]["timed_out"]:
            return {"released": done and not view["driver"]["timed_out"], "elapsed_s": round(now - start, 3), "polls": polls,
                    "gpus": status, "driver": view["driver"], "view": view}
        sleep(min(poll_interval, max(0.0, deadline - now)))
