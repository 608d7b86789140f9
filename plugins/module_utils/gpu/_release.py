# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Whether each selected GPU is released: the one place that decides it.

gpu_kill (its check-mode prediction and its wait), gpu_wait (and so check_gpus.yml and the vllm_server
role's gates) call `gpu_status`. A GPU, or a selected MIG instance, is released when:
- no target of the selection holds it,
- the driver answers it without an error and did not hang,
- its used memory (MiB), less what the holders left out by the operator's choice (pids, match, users, the owner
  filters, exclude) hold there, is at most max_used_mib (plus the reserved-memory allowance of NVML memory info
  v1), or the memory is not reported.
What the protection rules leave alone (the GPU daemons, this module's own chain) is never signalled, but its memory
counts: nobody chose to leave it out, and a process that holds memory keeps the GPU from being free whatever it is.

What the holders left alone hold (`left_alone_mib`, `protected_mib`) is the one rule of what memory a run may expect
back (the rest, `rest_mib`): the wait, the check, the reset's summary and report read it from these entries, and
what no process explains is merge's `unexplained_mib` (_holders), which the guard's textfile exports too. A dead
creator's listed memory is held by the processes that hold its context's handles (kept_contexts): where all of them
are left alone, it stays with them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, cast

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _shapes

if TYPE_CHECKING:
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._select import Selection

# A holder of the snapshot, as Selection.split hands it (left-alone ones with their "reason").
HolderLike = Mapping[str, Any]
# Selection.split's result: {"targets", "left_alone", "counted", ...}.
Split = Mapping[str, List[Any]]
# Whether a holder holds the GPU (or MIG instance) at hand.
Holds = Callable[[HolderLike], bool]


def is_released(
    holders: Sequence[object],
    error: Optional[str],
    timed_out: bool,
    used_mib: Optional[int],
    left_alone_mib: int,
    max_used_mib: int,
    allowance_mib: int = 0,
) -> bool:
    """The release test. `used_mib` None (memory not reported) leaves the holders to decide."""
    if holders or error or timed_out:
        return False
    return used_mib is None or used_mib - left_alone_mib <= max_used_mib + allowance_mib


def rest_mib(entry: Mapping[str, Any]) -> Optional[int]:
    """What a gpu_status entry's used memory may still give back: used memory less what the holders left alone keep
    there (left out by choice or by the protection rules); None where memory is not reported."""
    used: Optional[int] = entry.get("memory_used_mib")
    if used is None:
        return None
    return max(0, used - int(entry.get("left_alone_mib") or 0) - int(entry.get("protected_mib") or 0))


def left_alone(split: Split, index: Optional[int], holds: Holds) -> List[_shapes.LeftAlone]:
    """The left-alone holders of Selection.split's `split` that `holds` tells hold GPU `index` (brief), with their
    "reason" and "counted" (left alone by the protection rules: their memory counts)."""
    counted = set(split["counted"])
    return [
        cast(_shapes.LeftAlone, dict(brief(h, index), reason=h["reason"], counted=h["pid"] in counted))
        for h in split["left_alone"]
        if holds(h)
    ]


def held_by_protected(entry: _shapes.WaitGpu, max_used_mib: int) -> bool:
    """True when only the memory of holders the protection rules leave alone keeps a gpu_status entry from being
    released: no target holds it, the driver answers it, and without that memory it would be. Waiting cannot change
    that (nothing will end them); the wait stops there."""
    rest = rest_mib(entry)
    if entry["holders"] or entry["error"] or rest is None or not entry["protected_mib"]:
        return False
    return rest <= max_used_mib + entry["reserved_allowance_mib"]


def left_alone_mib(left: Iterable[_shapes.BriefHolder], figures: Mapping[str, Any], cause: Optional[str] = None) -> int:
    """MiB that the left-alone holders `left` (brief entries) hold on a GPU or MIG instance with `figures` (its
    unexplained_mib and exited creators), by their listed memory. Memory no listed process explains counts as theirs
    when one of them holds it through its device file where such holders hold it (docs/attribution.md rule 5: a GPU
    without exited creators, or a driver that does not list by this namespace, `cause` "unlisted"); on a GPU that
    carries exited creators' contexts, those are what device-file holders hold (kept_contexts)."""
    total = sum(h["memory_mib"] or 0 for h in left)
    rule5 = not figures.get("exited") or cause == "unlisted"
    if rule5 and figures.get("unexplained_mib") and any(h["attribution"] == "device_file" for h in left):
        total += figures["unexplained_mib"]
    return total


def kept_contexts(
    exited: Sequence[_shapes.Foreign],
    groups: Optional[Sequence[Sequence[int]]],
    targets: Iterable[int],
    left: Iterable[int],
) -> Optional[_shapes.KeptContexts]:
    """The contexts of exited creators (`exited`, a GPU's or MIG instance's) that the holders left alone keep, or None
    where no left-alone process holds one.

    `groups`: the holders of those contexts, grouped by the device files they share (the snapshot's context_groups,
    _shared_files: one group per creator whose files they inherited; None where the kernel did not tell: then they
    count as one group); `targets` and `left`: the PIDs of the selected and left-alone holders there. Each group keeps
    at least one context while one of its members lives. A group with a target and a left-alone member keeps its
    context after the target's end (`shared`: such groups). The listed memory stays with the left-alone holders
    (`creators`, `mib`) once no group has a target and the creators listed are no more than their groups: until then
    some of it is the targets' or is being released (`unheld`: how many contexts no group here can hold)."""
    target_set, left_set = set(targets), set(left)
    found = [target_set | left_set] if groups is None else [set(group) & (target_set | left_set) for group in groups]
    mine = [group for group in found if group]
    keepers = sorted({pid for group in mine for pid in group & left_set})
    if not exited or not keepers:
        return None
    kept_by = [group for group in mine if group <= left_set]
    targets_hold = any(group & target_set for group in mine)
    whole = not targets_hold and len(exited) <= len(kept_by)
    return {
        "creators": sorted(item["pid"] for item in exited) if whole else [],
        "mib": sum(item["used_mib"] or 0 for item in exited) if whole else 0,
        "holders": keepers,
        "shared": [sorted(group) for group in mine if group & left_set and group & target_set],
        "unheld": 0 if targets_hold else max(0, len(exited) - len(kept_by)),
    }


def gpu_status(selection: Selection, snapshot: _shapes.Snapshot, max_used_mib: int) -> List[_shapes.WaitStatus]:
    """Per selected GPU or MIG instance, is it released? A list of dicts with _shapes.WAIT_GPU_KEYS.

    "holders" are the targets still holding it (brief), "left_alone" the left-alone holders (brief and
    reason, and "counted": whether its memory counts), "left_alone_mib" the memory of those the operator left out
    (subtracted), "protected_mib" that of those the protection rules leave alone (counted: see the module's
    docstring). MIG instances add "mig_profile"; a whole GPU in MIG mode that is not released adds "mig_in_use" (its
    instances that hold memory or processes). "memory_note" says why more used memory counts as idle (NVML memory
    info v1).
    Without any index map (no NVML, no /proc/driver/nvidia) there is one entry with index None for all GPUs.
    """
    split = selection.split(snapshot)
    if not snapshot["gpus"]:
        return [
            _wait_status(
                _shapes.WAIT_GPU_KEYS,
                holders=[brief(h, None) for h in split["targets"]],
                left_alone=left_alone(split, None, lambda h: True),
                left_alone_mib=0,
                protected_mib=0,
                foreign=[],
                exited=[],
                suspects=[],
                memory_checked=False,
                reserved_allowance_mib=0,
                released=not split["targets"],
            )
        ]
    # A hung driver leaves memory unknown: no GPU is released then, whatever /proc shows.
    timed_out = bool((snapshot.get("driver") or {}).get("timed_out"))
    status: List[_shapes.WaitStatus] = []
    for gpu in snapshot["gpus"]:
        index = gpu["index"]
        if selection.indices is not None and index not in selection.indices:
            continue
        if index not in selection.instances:
            entry = _entry(gpu, gpu, None, split, _holds_gpu(index), timed_out, max_used_mib)
            if not entry["released"] and gpu.get("mig_devices"):
                entry["mig_in_use"] = [
                    cast(
                        _shapes.MigInUse,
                        {key: device.get(key) for key in ("uuid", "profile", "memory_used_mib", "holder_pids")},
                    )
                    for device in gpu["mig_devices"]
                    if device.get("holder_pids") or (device.get("memory_used_mib") or 0) > max_used_mib
                ]
            status.append(entry)
            continue
        devices: Dict[str, Mapping[str, Any]] = {device["uuid"]: device for device in gpu.get("mig_devices") or ()}
        for uuid in sorted(selection.instances[index]):
            entry = _entry(
                gpu, devices.get(uuid) or {}, uuid, split, _holds_instance(uuid, index), timed_out, max_used_mib
            )
            entry["mig_profile"] = (devices.get(uuid) or {}).get("profile")
            status.append(entry)
    return status


def _holds_gpu(index: int) -> Holds:
    """Whether a holder holds the whole GPU `index`."""
    return lambda h: _shapes.holds(h, index)


def _holds_instance(uuid: str, index: int) -> Holds:
    """Whether a holder holds MIG instance `uuid` of GPU `index`."""
    return lambda h: _shapes.holds(h, index, uuid)


def _entry(
    gpu: _shapes.Gpu,
    figures: Mapping[str, Any],
    mig_uuid: Optional[str],
    split: Split,
    holds: Holds,
    timed_out: bool,
    max_used_mib: int,
) -> _shapes.WaitStatus:
    """The status of a whole GPU (figures is the GPU, mig_uuid None) or of one MIG instance of it (figures is its
    MIG device, {} when it is gone); `holds(holder)` tells whether a holder holds this GPU or instance."""
    index = gpu["index"]
    holders = [brief(h, index) for h in split["targets"] if holds(h)]
    left = left_alone(split, index, holds)
    kept = _kept(gpu, figures, holders, left)
    # A device-file holder's memory is the exited creators' listed memory it keeps: counted once, as kept["mib"].
    keeps = set(kept["holders"]) if kept and kept["mib"] else set()
    mine = [h for h in left if not (h["pid"] in keeps and h["attribution"] == "device_file")]
    protected_mib = sum(h["memory_mib"] or 0 for h in mine if h["counted"])
    error = gpu.get("error")
    if mig_uuid is not None and not figures and not error:
        error = "MIG device %s is no longer there (MIG reconfigured?)" % mig_uuid
    used = figures.get("memory_used_mib")
    allowance = figures.get("reserved_allowance_mib") or 0
    cause = gpu.get("unexplained_cause") if figures.get("memory_unexplained") else None
    left_mib = left_alone_mib([h for h in mine if not h["counted"]], figures, cause)
    if kept and any(h["counted"] for h in left if h["pid"] in kept["holders"]):
        protected_mib += kept["mib"]
    elif kept:
        left_mib += kept["mib"]
    return _wait_status(
        _shapes.WAIT_GPU_KEYS,
        index=index,
        uuid=gpu.get("uuid"),
        mig_uuid=mig_uuid,
        memory_used_mib=used,
        memory_reserved_mib=gpu.get("memory_reserved_mib") if mig_uuid is None else None,
        unexplained_mib=figures.get("unexplained_mib"),
        memory_unexplained=figures.get("memory_unexplained"),
        unexplained_cause=cause,
        holders=holders,
        left_alone=left,
        left_alone_mib=left_mib,
        protected_mib=protected_mib,
        foreign=figures.get("foreign", []),
        exited=figures.get("exited", []),
        kept=kept,
        suspects=gpu["suspects"],
        # Memory the driver does not report (a GB10: what its lists charge stands in for used memory) is not checked.
        memory_checked=used is not None and figures.get("memory_supported") is not False,
        error=error,
        reserved_allowance_mib=allowance,
        memory_note=_v1_note(allowance),
        released=is_released(holders, error, timed_out, used, left_mib, max_used_mib, allowance),
    )


def _kept(
    gpu: _shapes.Gpu,
    figures: Mapping[str, Any],
    holders: Sequence[_shapes.BriefHolder],
    left: Sequence[_shapes.LeftAlone],
) -> Optional[_shapes.KeptContexts]:
    """kept_contexts of a gpu_status entry: the exited creators of `figures` (the GPU or MIG instance), the holders
    of their contexts (attribution device_file) among its targets `holders` and its holders left alone `left`."""
    exited = figures.get("exited") or []
    if not exited:
        return None
    return kept_contexts(
        exited,
        gpu.get("context_groups"),
        [h["pid"] for h in holders if h["attribution"] == "device_file"],
        [h["pid"] for h in left if h["attribution"] == "device_file"],
    )


def _wait_status(keys: Sequence[str], **values: Any) -> _shapes.WaitStatus:
    """A gpu_status entry: exactly the keys of _shapes.WaitGpu (None for those not given)."""
    return cast(_shapes.WaitStatus, _shapes.entry(keys, **values))


def _v1_note(allowance: int) -> Optional[str]:
    """What a GPU whose used memory includes reserved memory (NVML memory info v1) is held against, or None."""
    if not allowance:
        return None
    return (
        "reserved memory cannot be told apart on this driver (NVML memory info v1, whose used memory includes it): "
        "up to %d MiB more counts as idle (5%% of the memory, at most 1 GiB: what real GPUs reserve)" % allowance
    )


def brief(holder: HolderLike, index: Optional[int]) -> _shapes.BriefHolder:
    """The fields of a holder that a wait report needs, with its memory on GPU `index` and its parent."""
    key = None if index is None else str(index)
    return {
        "pid": holder["pid"],
        "comm": holder["comm"],
        "state": holder["state"],
        "cmdline": holder["cmdline"],
        "user": holder["user"],
        "memory_mib": holder["memory_mib"].get(key) if key else None,
        "attribution": holder.get("attribution", {}).get(key) if key else None,
        "parent": holder.get("parent"),
    }
