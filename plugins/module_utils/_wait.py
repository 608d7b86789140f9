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

# Default threshold: NVML v2 `used` excludes reserved memory, so an idle GPU reports a few MiB;
# 256 MiB tolerates idle usage and small driver allocations, and no CUDA context is that small.
DEFAULT_MAX_USED_MIB = 256
# Each NVML query may take the time left before the timeout plus this much (seconds): a healthy
# driver answers in milliseconds, a hung one is given up on at most this long after the timeout.
NVML_SLACK_S = 1.0
# Seconds between two looks: a look costs a few ms on a node with a few hundred processes.
DEFAULT_POLL_INTERVAL_S = 0.02
# The wait's options, shared by gpu_wait and gpu_kill (wait=true).
WAIT_ARGS = dict(
    max_used_mib=dict(type="int", default=DEFAULT_MAX_USED_MIB),
    poll_interval=dict(type="float", default=DEFAULT_POLL_INTERVAL_S),
)


def next_step(gpu):
    """What an operator can do about a GPU (a gpu_status entry) that was not released: one sentence."""
    index = gpu["index"]
    which = "the GPUs" if index is None else "GPU %s" % index
    if gpu.get("error"):
        return ("NVML answers %s with an error (%s): it may have fallen off the bus; look for Xid errors in the kernel "
                "log (dmesg | grep -i xid), then reset it (nvidia-smi --gpu-reset -i %s) or reboot the host"
                % (which, gpu["error"], index))
    stuck = [h for h in gpu["holders"] if h["state"] == "D"]
    if stuck:
        return ("PID %s (%s) is in uninterruptible sleep (D), stuck in the driver: SIGKILL cannot end it; %s"
                % (stuck[0]["pid"], stuck[0]["comm"],
                   "reboot the host" if index is None else
                   "reset the GPU (nvidia-smi --gpu-reset -i %s) or reboot the host" % index))
    if gpu["holders"]:
        parents = ["PID %s (%s)" % (h["parent"]["pid"], h["parent"]["comm"]) for h in gpu["holders"] if h.get("parent")]
        text = "processes still hold %s: end them with gpuops.nvidia.gpu_kill" % which
        if parents:
            text += ("; if they come back after being ended, stop their parent (%s: for example a torchrun or Ray agent, "
                     "or a systemd unit) first" % ", ".join(sorted(set(parents))))
        return text
    if gpu.get("foreign"):
        return ("%s; run the check on the host (outside this PID namespace) to see and end that process"
                % "; ".join(describe_foreign(item, index) for item in gpu["foreign"]))
    if gpu["memory_checked"]:
        text = ("memory is used that no process explains (a leaked context, or memory still being released): "
                "wait longer, or reset the GPU (nvidia-smi --gpu-reset -i %s, needs no client on the device, "
                "nvidia-persistenced included) or reboot" % index)
        if gpu.get("suspects"):
            text += ("; only NVML clients hold its device file (PIDs %s), and they hold no memory"
                     % ", ".join(str(p) for p in gpu["suspects"]))
        return text
    return "the driver did not report memory for %s: check the NVIDIA driver (nvidia-smi)" % which


def describe_foreign(item, index):
    """One driver-listed PID that no process here confirms, in words."""
    mib = "memory not reported" if item["used_mib"] is None else "%s MiB" % item["used_mib"]
    if item["reason"] == "absent":
        return ("the driver lists PID %s (%s) on GPU %s; no such process holds it in this PID namespace (a container?)"
                % (item["pid"], mib, index))
    return ("the driver lists PID %s (%s) on GPU %s; PID %s here (%s) does not hold that GPU: it is another process "
            "in this PID namespace (a container?)" % (item["pid"], mib, index, item["pid"], item["comm"]))


def wait_released(inspector, selection, timeout, max_used_mib=DEFAULT_MAX_USED_MIB, poll_interval=DEFAULT_POLL_INTERVAL_S,
                  clock=time.monotonic, sleep=time.sleep, first=None):
    """Poll snapshots until every GPU `selection` (a _select.Selection) selects is released or `timeout` seconds pass.

    Returns {"released" (bool), "elapsed_s", "polls", "gpus" (Selection.gpu_status of the last poll),
    "driver" (the last snapshot's driver state), "view" (the last snapshot itself)}. A driver that stops answering,
    or a selected GPU that the driver answers with an error (a lost GPU), ends the wait at once with released=False:
    waiting cannot change either (the NVML query is bounded by the time left plus NVML_SLACK_S).
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
            view, first = first, None
        else:
            view = inspector.snapshot(timeout=max(0.0, deadline - clock()) + NVML_SLACK_S, scope="listed",
                                      indices=selection.indices, tolerance_mib=max_used_mib, owners=bool(selection.owners))
        status = selection.gpu_status(view, max_used_mib)
        done = all(gpu["released"] for gpu in status)
        now = clock()
        hopeless = view["driver"]["timed_out"] or any(gpu.get("error") for gpu in status)
        if done or now >= deadline or hopeless:
            return {"released": done and not view["driver"]["timed_out"], "elapsed_s": round(now - start, 3), "polls": polls,
                    "gpus": status, "driver": view["driver"], "view": view}
        sleep(min(poll_interval, max(0.0, deadline - now)))


def conclude(result, driver_timeout, single_look=False):
    """Complete a wait_released() result for a module: "memory_checked", "left_alone" (one entry per GPU a left-alone
    holder holds), "next_step" on each GPU not released; return the message (one line per GPU that is not released,
    saying why and what to do next; never None or empty lists)."""
    driver = result["driver"]
    result["memory_checked"] = all(gpu["memory_checked"] for gpu in result["gpus"])
    result["left_alone"] = [dict(h, gpu=gpu["index"]) for gpu in result["gpus"] for h in gpu["left_alone"]]
    left = ""
    if result["left_alone"]:
        named = {"PID %s (%s, %s)" % (h["pid"], h["comm"], h["reason"]) for h in result["left_alone"]}
        left = "; left alone: %s" % ", ".join(sorted(named))
    if result["released"]:
        what = "released" if result["memory_checked"] else "no holder left (memory not checked: no driver)"
        return "%s after %.2f s%s" % (what, result["elapsed_s"], left)
    stuck = [gpu for gpu in result["gpus"] if not gpu["released"]]
    for gpu in stuck:
        gpu["next_step"] = next_step(gpu)
    if driver["timed_out"]:
        return ("NVML did not answer within driver_timeout (%s s): the driver may be hung (%s); GPU memory release "
                "could not be confirmed. Next: look for Xid errors in the kernel log (dmesg) and check nvidia-smi; a "
                "hung driver needs a GPU reset or a reboot" % (driver_timeout, driver["error"]))
    return "%s: %s%s" % ("not free" if single_look else "not released after %.1f s" % result["elapsed_s"],
                         "; ".join(describe(gpu) for gpu in stuck), left)


def describe_unread(result):
    """The selected GPUs whose used memory was not read (a wait_released() result completed by conclude()), in words."""
    unread = [gpu for gpu in result["gpus"] if not gpu["memory_checked"]]
    which = ("every GPU" if any(gpu["index"] is None for gpu in unread)
             else "GPU %s" % ", ".join(str(gpu["index"]) for gpu in unread))
    return ("used memory of %s not read (NVIDIA driver library not usable: %s); no process holds %s (/proc scan)"
            % (which, result["driver"].get("error") or "no error given", "them" if which == "every GPU" or len(unread) > 1 else "it"))


def describe(gpu):
    """One GPU that is not released, in words (never None or empty lists)."""
    parts = []
    if gpu["memory_used_mib"] is not None:
        parts.append("%s MiB used" % gpu["memory_used_mib"])
        if gpu["left_alone_mib"]:
            parts.append("%s MiB of it by holders left alone" % gpu["left_alone_mib"])
        if gpu["unexplained_mib"]:
            parts.append("%s MiB that no listed process explains" % gpu["unexplained_mib"])
    elif gpu.get("error"):
        parts.append("error %s" % gpu["error"])
    else:
        parts.append("memory unknown")
    if gpu["holders"]:
        parts.append("held by %s" % ", ".join("PID %s %s (state %s)" % (h["pid"], h["comm"], h["state"]) for h in gpu["holders"]))
    else:
        parts.append("no selected holder")
    name = "GPUs" if gpu["index"] is None else "GPU %s" % gpu["index"]
    if gpu.get("mig_uuid"):
        name += " MIG instance %s (%s)" % (gpu["mig_uuid"], gpu.get("mig_profile"))
    if gpu.get("memory_note"):
        parts.append(gpu["memory_note"])
    if gpu.get("mig_in_use"):
        parts.append("MIG instances in use: %s" % "; ".join(
            "GPU %s MIG instance %s (%s): %s, %s" % (
                gpu["index"], device["uuid"], device["profile"],
                "memory unknown" if device["memory_used_mib"] is None else "%s MiB used" % device["memory_used_mib"],
                "held by PID %s" % ", ".join(str(pid) for pid in device["holder_pids"]) if device["holder_pids"]
                else "no holder found") for device in gpu["mig_in_use"]))
    return "%s: %s; next: %s" % (name, ", ".join(parts), gpu["next_step"])
