# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Why selected GPUs are not free, in words, and what the operator can do next.

The messages of a wait that did not end with its GPUs free (gpu_wait, gpu_kill with wait=true, the reset's
verification, check_gpus): one line per GPU, never None or empty lists. Imported only where such a message is
written (_wait.conclude, gpu_wait's require_memory), so the common free case does not compile it.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping, Optional

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _shapes


def _named(holders: Iterable[Mapping[str, Any]]) -> str:
    """Holders (brief entries) in words: "PID 4 python (state S), PID 5 ..."."""
    return ", ".join("PID %s %s (state %s)" % (h["pid"], h["comm"], h["state"]) for h in holders)


def describe(gpu: _shapes.WaitStatus, with_step: bool = True) -> str:
    """One GPU that is not released, in words (never None or empty lists), with its next step unless `with_step` is
    false (check_gpus says one next step for the GPUs that a reset frees)."""
    parts = []
    if gpu["memory_used_mib"] is not None:
        parts.append("%s MiB used" % gpu["memory_used_mib"])
        if gpu["left_alone_mib"]:
            parts.append("%s MiB of it by holders left alone" % gpu["left_alone_mib"])
        if gpu.get("protected_mib"):
            parts.append("%s MiB of it by protected holders, which counts" % gpu["protected_mib"])
        if gpu["unexplained_mib"]:
            parts.append("%s MiB that no listed process explains" % gpu["unexplained_mib"])
    elif gpu.get("error"):
        parts.append("error %s" % gpu["error"])
    else:
        parts.append("memory unknown")
    if gpu["holders"]:
        parts.append("held by %s" % _named(gpu["holders"]))
    else:
        parts.append("no selected holder")
    name = "GPUs" if gpu["index"] is None else "GPU %s" % gpu["index"]
    if gpu.get("mig_uuid"):
        name += " MIG instance %s (%s)" % (gpu["mig_uuid"], gpu.get("mig_profile"))
    note = gpu.get("memory_note")
    if note:
        parts.append(note)
    if gpu.get("mig_in_use"):
        parts.append(
            "MIG instances in use: %s"
            % "; ".join(
                "GPU %s MIG instance %s (%s): %s, %s"
                % (
                    gpu["index"],
                    device["uuid"],
                    device["profile"],
                    "memory unknown"
                    if device["memory_used_mib"] is None
                    else "%s MiB used" % device["memory_used_mib"],
                    "held by PID %s" % ", ".join(str(pid) for pid in device["holder_pids"])
                    if device["holder_pids"]
                    else "no holder found",
                )
                for device in gpu["mig_in_use"]
            )
        )
    text = "%s: %s" % (name, ", ".join(parts))
    return "%s; next: %s" % (text, gpu["next_step"]) if with_step else text


def found_by_scan(gpus: Iterable[_shapes.WaitStatus]) -> str:
    """The holders that the /proc scan alone found on `gpus` (gpu_status entries of a wait whose driver did not
    answer), as a clause for the message ("" when it found none): a process that still holds a GPU is named, even
    where its memory could not be read."""
    held = [
        "%s: %s" % ("GPUs" if gpu["index"] is None else "GPU %s" % gpu["index"], _named(gpu["holders"]))
        for gpu in gpus
        if gpu["holders"]
    ]
    return "; holders found by the /proc scan alone: %s" % "; ".join(held) if held else ""


def next_step(gpu: _shapes.WaitStatus, driver: Optional[Mapping[str, Any]] = None) -> str:
    """What an operator can do about a GPU (a gpu_status entry) that was not released: one sentence. `driver`: the
    snapshot's driver state (its version words memory no process explains)."""
    index = gpu["index"]
    which = "the GPUs" if index is None else "GPU %s" % index
    if gpu.get("error"):
        # A GPU reset needs no process on the GPU: its holders are named, to be ended first.
        first = ""
        if gpu["holders"]:
            first = "end PID %s, which still hold%s it (gpuops.nvidia.gpu_kill), then " % (
                ", ".join(str(h["pid"]) for h in gpu["holders"]),
                "s" if len(gpu["holders"]) == 1 else "",
            )
        return (
            "NVML answers %s with an error (%s): it may have fallen off the bus; look for Xid errors in the kernel "
            "log (dmesg | grep -i xid), then %sreset it (nvidia-smi --gpu-reset -i %s) or reboot the host"
            % (which, gpu["error"], first, index)
        )
    stuck = [h for h in gpu["holders"] if h["state"] == "D"]
    if stuck:
        return "PID %s (%s) is in uninterruptible sleep (D), stuck in the driver: SIGKILL cannot end it; %s" % (
            stuck[0]["pid"],
            stuck[0]["comm"],
            "reboot the host"
            if index is None
            else "reset the GPU (nvidia-smi --gpu-reset -i %s) or reboot the host" % index,
        )
    if gpu["holders"]:
        return "processes still hold %s: end them with gpuops.nvidia.gpu_kill%s" % (which, restarters(gpu["holders"]))
    if gpu.get("protected_mib"):
        return protected_step(gpu)
    if gpu.get("foreign"):
        return "%s; run the check on the host (outside this PID namespace) to see and end that process" % "; ".join(
            describe_foreign(item, index) for item in gpu["foreign"]
        )
    kept = gpu.get("kept")
    if gpu.get("exited") and not (kept and kept["creators"]):
        # The driver lists an exited creator with its memory (also where it reports no used memory, a GB10) that the
        # holders left alone do not keep: its context lives on in whoever holds its handles. Never a GPU reset while
        # such a holder lives.
        return exited_step(gpu) + _suspects(gpu)
    if gpu["memory_checked"]:
        return unexplained_step(gpu, driver) + _suspects(gpu)
    return "the driver did not report memory for %s: check the NVIDIA driver (nvidia-smi)" % which


def ended_by_a_reset(gpu: _shapes.WaitStatus) -> bool:
    """Whether ending the GPU's selected holders is its next step (what reset_gpus does): holders hold it, none is
    stuck in the driver (D) and NVML answers it (next_step's own order)."""
    return bool(gpu["holders"]) and not gpu.get("error") and all(h["state"] != "D" for h in gpu["holders"])


# The agents (_owners.agent_kind) that start the processes they own again when those end, in words.
RESTARTERS = {"torchrun": "a torchrun agent", "ray": "a Ray raylet", "supervisord": "supervisord"}


def restarters(holders: Iterable[Mapping[str, Any]]) -> str:
    """The clause naming the holders' parents that start them again, torchrun, a Ray raylet or supervisord, known by
    their command line; "" where no parent is one (vLLM's EngineCore does not start its workers again)."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._owners import agent_kind

    named = set()
    for parent in (h.get("parent") for h in holders):
        kind = agent_kind(parent["comm"], (parent.get("cmdline") or "").split()) if parent else None
        if parent and kind in RESTARTERS:
            named.add("PID %s (%s): %s" % (parent["pid"], parent["comm"], RESTARTERS[kind]))
    if not named:
        return ""
    return "; if they come back after being ended, stop their parent (%s) first" % ", ".join(sorted(named))


def _suspects(gpu: _shapes.WaitStatus) -> str:
    """The clause naming the processes with the GPU's device file open that show no context there ("" when none)."""
    if not gpu.get("suspects"):
        return ""
    return (
        "; its device file is open only in processes that show no context there (PIDs %s: NVML clients or "
        "CUDA-initialized processes), named and never ended" % ", ".join(str(p) for p in gpu["suspects"])
    )


def _pids(pids: Iterable[int]) -> str:
    return ", ".join(str(pid) for pid in pids)


def exited_step(gpu: _shapes.WaitStatus) -> str:
    """The next step for a GPU whose used memory the driver still lists for creators that have exited, with no target
    left there: the holders left alone keep some of those contexts (gpu["kept"]), the rest has no holder here."""
    exited = gpu.get("exited") or []
    figures = [item["used_mib"] for item in exited]
    text = "the driver still lists PID %s on GPU %s (%s), which %s exited: a context lives until the last process " % (
        _pids(item["pid"] for item in exited),
        gpu["index"],
        "memory not reported" if None in figures else "%d MiB in all" % sum(m or 0 for m in figures),
        "has" if len(exited) == 1 else "have",
    )
    text += "holding its handles exits"
    kept = gpu.get("kept")
    if kept:
        text += "; PID %s, left alone, hold%s %s of these contexts: that memory stays with them until they exit" % (
            _pids(kept["holders"]),
            "s" if len(kept["holders"]) == 1 else "",
            "some" if kept["unheld"] else "all",
        )
        if not kept["unheld"]:
            return text + " (select them to free it)"
    return text + (
        "; no process in this PID namespace shows %s: the memory is being released (wait longer), or its holder "
        "cannot be read here (run the check as root)" % ("the other %d" % kept["unheld"] if kept else "their contexts")
    )


def unexplained_step(gpu: _shapes.WaitStatus, driver: Optional[Mapping[str, Any]]) -> str:
    """The next step for a GPU whose used memory no process explains, worded by what this driver lists
    (docs/attribution.md rule 4): drivers from 535.113.01 list only the caller's PID namespace, older ones every
    client by its initial-namespace PID. No GPU reset and no other namespace while a process here holds the GPU."""
    index = gpu["index"]
    mib = " (%s MiB)" % gpu["unexplained_mib"] if gpu.get("unexplained_mib") else ""
    reset = (
        "ansible-playbook gpuops.nvidia.reset_gpus -e reset_gpus_gpu_reset=true, which stops the daemons that hold "
        "the GPU and runs nvidia-smi --gpu-reset -i %s (docs/recovery.md), or reboot" % index
    )
    left = gpu.get("left_alone") or []
    if left:
        return (
            "memory is used that no process explains%s: leaked, or still being released (wait longer); PID %s, left "
            "alone, still hold%s GPU %s" % (mib, _pids(h["pid"] for h in left), "s" if len(left) == 1 else "", index)
        )
    cause = gpu.get("unexplained_cause")
    version = (driver or {}).get("driver_version")
    if cause == "leaked":
        return (
            "memory is used that no process explains%s: this driver lists every process of this PID namespace, the "
            "host's own, so it is leaked or still being released (wait longer, then reset the GPU: %s)" % (mib, reset)
        )
    if cause == "unlisted" and version:
        return (
            "memory is used that no listed process explains%s: driver %s, older than 535.113.01, lists every client "
            "by its PID in the host's initial PID namespace, so it is leaked or still being released (wait longer, "
            "then reset the GPU: %s)" % (mib, version, reset)
        )
    return (
        "memory is used that no process explains in this PID namespace%s: it belongs to a process in "
        "another PID namespace (another container, or the host: drivers from 535.113.01 list only the caller's "
        "namespace; run the check there), or it is leaked or still being released (wait longer, then reset "
        "the GPU: %s)" % (mib, reset)
    )


def protected_step(gpu: _shapes.WaitStatus) -> str:
    """The next step for a GPU whose used memory is held by processes the protection rules leave alone."""
    return (
        "%s holds its memory and is left alone by default (it is never signalled), yet a GPU whose memory a process "
        "holds is not free. End it with include_protected=true (role: reset_gpus_include_protected), or leave it out "
        "knowingly with exclude (check_gpus_exclude, reset_gpus_exclude), which names it and its memory"
        % ", ".join(
            "PID %s (%s, %s MiB)" % (h["pid"], h["comm"], h["memory_mib"])
            for h in gpu["left_alone"]
            if h.get("counted") and h["memory_mib"]
        )
    )


def describe_foreign(item: _shapes.Foreign, index: Optional[int]) -> str:
    """One driver-listed PID that no process here confirms, in words."""
    mib = "memory not reported" if item["used_mib"] is None else "%s MiB" % item["used_mib"]
    if item["reason"] == "absent":
        return (
            "the driver lists PID %s (%s) on GPU %s; no such process holds it in this PID namespace (a container?)"
            % (item["pid"], mib, index)
        )
    if item["reason"] in ("exited", "reused"):
        return "the driver lists PID %s (%s) on GPU %s: the context of PID %s, which has exited%s" % (
            item["pid"],
            mib,
            index,
            item["pid"],
            ""
            if item["reason"] == "exited"
            else " (PID %s here, %s, is another process that got its number)" % (item["pid"], item["comm"]),
        )
    return (
        "the driver lists PID %s (%s) on GPU %s; PID %s here (%s) does not hold that GPU: it is another process "
        "in this PID namespace (a container?)" % (item["pid"], mib, index, item["pid"], item["comm"])
    )


def describe_unread(result: _shapes.Waited) -> str:
    """The selected GPUs whose used memory was not read (a wait_released() result completed by conclude()), in words:
    the driver library was not usable (holders from the /proc scan), or the driver does not report memory for them
    (NVML answers NOT_SUPPORTED, as on a unified-memory GB10; holders from its process lists and /proc)."""
    unread = [gpu for gpu in result["gpus"] if not gpu.get("memory_checked", True)]
    which = (
        "every GPU"
        if any(gpu["index"] is None for gpu in unread)
        else "GPU %s" % ", ".join(str(gpu["index"]) for gpu in unread)
    )
    them = "them" if which == "every GPU" or len(unread) > 1 else "it"
    driver = result.get("driver") or {}
    if driver.get("available"):
        return (
            "used memory of %s not reported by the driver (NVML answers NOT_SUPPORTED, as on a unified-memory GPU "
            "such as the GB10); no process holds %s (the driver's process lists and /proc)" % (which, them)
        )
    return "used memory of %s not read (NVIDIA driver library not usable: %s); no process holds %s (/proc scan)" % (
        which,
        driver.get("error") or "no error given",
        them,
    )


def not_checked(result: _shapes.Waited) -> str:
    """gpu_wait's message where require_memory refuses a wait that found no holder but read no memory."""
    if (result.get("driver") or {}).get("available"):
        step = (
            "the memory of such a GPU cannot be read on this host: leaked memory there stays unseen; accept a check "
            "of its holders alone (require_memory=false)"
        )
    else:
        step = (
            "make the NVIDIA driver library usable on this host (libnvidia-ml.so.1 and the nvidia-ml-py package), or "
            "accept a check from /proc alone (require_memory=false)"
        )
    return "not checked: %s; next: %s" % (describe_unread(result), step)


def _exited_context(item: _shapes.Foreign, index: int, holders: Iterable[Mapping[str, Any]]) -> str:
    """An exited creator's context in words: "the context of PID 4300 (6000 MiB), which has exited", and who has its
    number now. Where that process holds a context of its own on the GPU, the driver lists both under the number."""
    mib = "memory not reported" if item["used_mib"] is None else "%s MiB" % item["used_mib"]
    if item["reason"] != "reused":
        return "the context of PID %s (%s), which has exited" % (item["pid"], mib)
    if any(h["pid"] == item["pid"] and index in h.get("gpus", ()) for h in holders):
        return (
            "the context of PID %s, which has exited; PID %s here (%s) got its number and holds a context of its own "
            "there: the driver lists %s under PID %s for both"
            % (item["pid"], item["pid"], item["comm"], mib, item["pid"])
        )
    return (
        "the context of PID %s (%s), which has exited; PID %s here (%s) is another process that got its number and "
        "is left alone" % (item["pid"], mib, item["pid"], item["comm"])
    )


def exited_notes(view: _shapes.Snapshot) -> List[str]:
    """Sentences naming, per GPU, the listed creators that have exited and who holds their contexts (a snapshot view,
    _gpus.Inspector.snapshot): "GPU 0: PID 4321, 4322 hold the context of PID 4300 (6000 MiB), which has exited"."""
    notes = []
    for gpu in view.get("gpus") or ():
        for item in gpu.get("exited") or ():
            holders = sorted(
                h["pid"]
                for h in view.get("holders") or ()
                if item["pid"] in (h.get("contexts_of") or {}).get(str(gpu["index"]), ())
            )
            whose = _exited_context(item, gpu["index"], view.get("holders") or ())
            if holders:
                notes.append(
                    "GPU %s: PID %s hold%s %s"
                    % (gpu["index"], ", ".join(str(p) for p in holders), "s" if len(holders) == 1 else "", whose)
                )
            else:
                notes.append(
                    "GPU %s: no process in this PID namespace holds %s (its holder runs elsewhere, or "
                    "cannot be read)" % (gpu["index"], whose)
                )
    return notes
