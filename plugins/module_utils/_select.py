# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What is selected, ended and waited for: one place for gpu_kill, gpu_wait, check_gpus and vllm_server.

A `Selection` is built once per module run from the selection options (`gpus`, `pids`, `match`,
`users`, `exclude`, `include_protected`) and a snapshot (for the GPU indices and UUIDs). Among the
holders of the selected GPUs (docs/attribution.md: holding a GPU means holding its memory), each
is a target (gpu_kill ends it, gpu_wait waits for it) or left alone with a reason; device users
(NVML clients, NCCL workers' extra device files) are never holders and never selected.
A GPU is released when no target holds it and its used memory, minus what the left-alone holders
hold there, is at or below max_used_mib.
"""
from __future__ import annotations

import os
import pwd
import re

from ansible_collections.gpuops.nvidia.plugins.module_utils import _owners, _proc, _shapes
from ansible_collections.gpuops.nvidia.plugins.module_utils._options import OptionError

# Daemons that hold GPUs legitimately; never signalled unless the operator says so explicitly.
# Matched against the process name (comm) and the basename of argv[0].
PROTECTED_NAMES = (
    "nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "nv-fabricmanager", "nvidia-fabricmanager",
    "nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "Xorg", "Xwayland", "X",
    "nvidia-device-plugin", "gpu-feature-discovery", "nvidia-mig-manager", "nvidia-smi",
    # Display servers and compositors (docs/attribution.md, "Protected by default"): a desktop's graphics contexts.
    "gnome-shell", "mutter", "kwin_wayland", "kwin_x11", "plasmashell", "sway", "weston",
    "gdm", "gdm-wayland-session", "gdm-x-session", "sddm", "sddm-helper", "sddm-greeter",
)

# Options shared by every module that selects holders (gpu_kill, gpu_wait), beside `gpus`.
HOLDER_ARGS = dict(
    pids=dict(type="list", elements="int"),
    match=dict(type="str"),
    users=dict(type="list", elements="str"),
    exclude=dict(type="list", elements="str", default=[]),
    include_protected=dict(type="bool", default=False),
    units=dict(type="list", elements="str"),
    containers=dict(type="list", elements="str"),
    pods=dict(type="list", elements="str"),
    slurm_jobs=dict(type="list", elements="str"),
)
# The owner filters among HOLDER_ARGS (docs/owners.md): each selects holders whose owner block matches.
OWNER_FILTERS = ("units", "containers", "pods", "slurm_jobs")

_ASCII_INDEX = re.compile(r"[0-9]+")


class SelectionError(OptionError):
    """Bad selection input: an unknown GPU or user, an empty list, an invalid regex. Nothing was signalled."""


def check_not_empty(**values):
    """Refuse an option given as an empty list or string: a templated list that came out empty must not
    widen to "everything". Omitting the option (None) means "any"."""
    empty = sorted(name for name, value in values.items() if value is not None and len(value) == 0)
    if empty:
        raise SelectionError(
            "%s %s empty: an empty selection selects nothing and is refused (omit the option to select any)"
            % (", ".join(empty), "is" if len(empty) == 1 else "are"))


class GpuIndices(list):
    """The sorted NVML indices select_gpus selected (a list), with `instances`: {index: frozenset of MIG UUIDs} for
    the MIG-enabled GPUs of which only some MIG instances were selected (an index not in it: the whole GPU)."""

    def __init__(self, indices=(), instances=None):
        super(GpuIndices, self).__init__(indices)
        self.instances = dict(instances or {})


def select_gpus(requested, view):
    """NVML indices selected by the `gpus` option (ASCII indices, GPU UUIDs or MIG UUIDs; None = all).

    Returns a GpuIndices (a sorted list of indices; a MIG UUID selects its parent's index and, in `instances`, that
    instance only, while the parent's index or GPU UUID selects every instance on it), or None for "all GPUs"
    (which also works when no index <-> minor map is known). Raises SelectionError for an empty list, an unknown
    index or UUID, or when specific GPUs are asked for but neither NVML nor /proc/driver/nvidia can map them.
    """
    if requested is None:
        return None
    check_not_empty(gpus=requested)
    if not view["gpus"]:
        driver = view.get("driver") or {}
        if driver.get("timed_out"):
            raise SelectionError("cannot select GPUs %s: NVML did not answer (%s), so GPU indices cannot be mapped to "
                                 "device files; the driver may be hung: look for Xid errors in the kernel log "
                                 "(dmesg), then reset the GPUs or reboot the host" % (list(requested), driver.get("error")))
        raise SelectionError("cannot select GPUs %s: the NVIDIA driver library is not usable (%s) and there is no "
                             "/proc/driver/nvidia to map GPU indices to device files; install or load the NVIDIA driver"
                             % (list(requested), driver.get("error")))
    by_uuid = {gpu["uuid"]: gpu["index"] for gpu in view["gpus"] if gpu.get("uuid")}
    by_mig_uuid = {device["uuid"]: gpu["index"] for gpu in view["gpus"] for device in gpu.get("mig_devices") or ()}
    indices = {gpu["index"] for gpu in view["gpus"]}
    selected, instances = set(), {}
    for item in requested:
        text = str(item).strip()
        if isinstance(item, bool):
            text = None
        if text is not None and _ASCII_INDEX.fullmatch(text) and int(text) in indices:
            selected.add(int(text))
        elif text in by_uuid:
            selected.add(by_uuid[text])
        elif text in by_mig_uuid:
            instances.setdefault(by_mig_uuid[text], set()).add(text)
        else:
            raise SelectionError("unknown GPU %r: GPUs are given as ASCII indices (this host has %s), GPU UUIDs (%s) "
                                 "or MIG UUIDs (%s)%s" % (item, sorted(indices), ", ".join(sorted(by_uuid)) or "none known",
                                                          ", ".join(sorted(by_mig_uuid)) or "none known", _bracket_hint(text)))
    # A whole GPU selected as well as some of its instances: the whole GPU.
    instances = {index: frozenset(uuids) for index, uuids in instances.items() if index not in selected}
    return GpuIndices(sorted(selected | set(instances)), instances)


def _bracket_hint(text):
    """How to write a list where `text` is a piece of one written in brackets, as key=value arguments (ansible -a
    'gpus=[0,1]') pass it: one string, which the list type splits at commas into '[0' and '1]'."""
    if not text or not (text.startswith("[") or text.endswith("]")):
        return ""
    return ("; a list in brackets in key=value arguments (ansible -a 'gpus=[0,1]') reaches the module as text: write "
            "gpus=0,1 there, or give the arguments as JSON (-a '{\"gpus\": [0, 1]}')")


def compile_match(pattern):
    """Compile the `match` regex (None = any), or raise SelectionError."""
    if pattern is None:
        return None
    check_not_empty(match=pattern)
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise SelectionError("invalid regex in match %r: %s" % (pattern, exc))


def check_users(users):
    """Refuse user names that do not exist on this host (UIDs, all ASCII digits, are taken as they are)."""
    if users is None:
        return None
    check_not_empty(users=users)
    unknown = []
    for name in users:
        if _ASCII_INDEX.fullmatch(name):
            continue
        try:
            pwd.getpwnam(name)
        except KeyError:
            unknown.append(name)
    if unknown:
        raise SelectionError("no such user on this host: %s (give user names that exist here, or UIDs)" % ", ".join(unknown))
    return set(users)


def check_pids(pids):
    if pids is None:
        return None
    check_not_empty(pids=pids)
    # A YAML `true` passes Ansible's int check as 1: PIDs are never booleans.
    bad = [pid for pid in pids if isinstance(pid, bool) or pid <= 0]
    if bad:
        raise SelectionError("pids must be positive process IDs, got %s" % ", ".join(str(p) for p in bad))
    return set(pids)


def check_options(params):
    """The checks of the selection options that need no look at the GPUs: run them before the first look, so bad
    input is refused even when the driver hangs."""
    check_not_empty(gpus=params.get("gpus"), **{name: params.get(name) for name in OWNER_FILTERS})
    check_pids(params.get("pids"))
    compile_match(params.get("match"))
    check_users(params.get("users"))
    errors = _owners.container_ref_errors(params["containers"]) if params.get("containers") else None
    if errors:
        raise SelectionError("; ".join(errors))


def ancestors(pid=None, proc="/proc"):
    """PIDs of `pid` (default: this process) and all its ancestors up to PID 1."""
    chain = set()
    current = os.getpid() if pid is None else pid
    while current and current not in chain:
        chain.add(current)
        stat = _proc.read_stat(current, proc)
        current = stat["ppid"] if stat else 0
    return chain


def protection(holder, own_chain, exclude=(), include_protected=False):
    """Why `holder` must not be signalled, or None.

    Never: PID 1, kernel threads, this process and its ancestors (the Ansible process chain
    and the SSH session). By default also the daemons of PROTECTED_NAMES and the names in
    `exclude`; `include_protected=True` lifts PROTECTED_NAMES (never `exclude`).
    """
    pid = holder["pid"]
    if pid == 1:
        return "PID 1 (init)"
    if pid in own_chain:
        return "this module or one of its ancestors (Ansible, the SSH session)"
    if holder.get("kernel_thread"):
        return "kernel thread"
    excluded = _matching_names(holder, exclude)
    if excluded:
        return "excluded by the exclude option (%s)" % ", ".join(excluded)
    daemons = [] if include_protected else _matching_names(holder, PROTECTED_NAMES)
    if daemons:
        return "protected GPU daemon (%s)" % ", ".join(daemons)
    return None


def _matching_names(holder, names):
    """The names in `names` that are this process's name: its comm (which the kernel cuts to
    15 bytes) or the basename of its argv[0]."""
    comm = holder.get("comm") or ""
    cmdline = holder.get("cmdline") or ""
    argv0 = os.path.basename(cmdline.split(" ", 1)[0]) if cmdline else ""
    return sorted({name for name in names if name and (comm == name[:15] or argv0 == name)})


class Selection:
    """The selection options of one module run, checked; decides targets and what is left alone.

    Selection(indices, pids=None, regex=None, users=None, exclude=(), include_protected=False, own_chain=None)
    with indices from select_gpus (None = all GPUs), pids/users as sets or None (any), regex compiled or None.
    """

    def __init__(self, indices, pids=None, regex=None, users=None, exclude=(), include_protected=False, own_chain=None,
                 owners=None):
        self.indices = indices
        # {index: MIG UUIDs} where only some MIG instances of a GPU are selected (select_gpus).
        self.instances = getattr(indices, "instances", None) or {}
        self.owners = {name: value for name, value in (owners or {}).items() if value is not None}
        self.pids = pids
        self.regex = regex
        self.users = users
        self.exclude = tuple(exclude or ())
        self.include_protected = include_protected
        self.own_chain = ancestors() if own_chain is None else own_chain

    @classmethod
    def from_params(cls, params, view):
        """Check the selection options of a module (`gpus` and HOLDER_ARGS; missing keys mean "any") against a
        snapshot; raises SelectionError before anything is signalled."""
        check_options(params)
        owners = {name: params.get(name) for name in OWNER_FILTERS}
        if owners["containers"]:
            known = {p["owner"]["container_id"] for p in view.get("holders", []) + view.get("device_users", [])
                     if (p.get("owner") or {}).get("container_id")}
            errors = _owners.container_ref_errors(owners["containers"], known)
            if errors:
                raise SelectionError("; ".join(errors))
        return cls(select_gpus(params.get("gpus"), view), pids=check_pids(params.get("pids")),
                   regex=compile_match(params.get("match")), users=check_users(params.get("users")),
                   exclude=params.get("exclude") or (), include_protected=params.get("include_protected", False),
                   owners=owners)

    @property
    def narrowed(self):
        """True when pids, match, users or an owner filter narrow the selection beyond GPUs."""
        return self.pids is not None or self.regex is not None or self.users is not None or bool(self.owners)

    def covers(self, holder):
        """True when `holder` holds one of the selected GPUs (where MIG instances are selected: one of them)."""
        if self.indices is None:
            return True
        for index in set(self.indices) & set(holder["gpus"]):
            wanted = self.instances.get(index)
            if wanted is None or wanted & set((holder.get("mig") or {}).get(str(index), ())):
                return True
        return False

    def narrowing_reason(self, holder):
        """Why pids, match, users or an owner filter leave this holder alone, or None (the protection rules aside)."""
        if self.pids is not None and holder["pid"] not in self.pids:
            return "not in pids"
        if self.regex is not None and not self.regex.search(holder.get("cmdline") or ""):
            return "command line does not match %r" % self.regex.pattern
        if self.users is not None and holder.get("user") not in self.users and str(holder.get("uid")) not in self.users:
            return "user %s not in users" % holder.get("user")
        if self.owners:
            return _owners.mismatch(holder.get("owner"), **self.owners)
        return None

    def split(self, view):
        """{"targets": [holder], "left_alone": [holder + reason], "protected": [the left_alone entries that the
        protection rules or `exclude` leave alone, rather than pids, match, users or an owner filter], "not_holding":
        [PIDs from `pids` that hold none of the selected GPUs]} for the holders of the selected GPUs in `view`."""
        targets, left, protected = [], [], []
        covered = [h for h in view["holders"] if self.covers(h)]
        for holder in covered:
            narrowed = self.narrowing_reason(holder)
            reason = narrowed or protection(holder, self.own_chain, self.exclude, self.include_protected)
            if reason is None:
                targets.append(holder)
                continue
            left.append(dict(holder, reason=reason))
            if narrowed is None:
                protected.append(left[-1])
        not_holding = sorted((self.pids or set()) - {h["pid"] for h in covered})
        return {"targets": targets, "left_alone": left, "protected": protected, "not_holding": not_holding}

    def gpu_status(self, view, max_used_mib):
        """Per selected GPU: is it released? [dicts with _shapes.WAIT_GPU_KEYS]: "holders" are the targets still
        holding it (brief), "left_alone" the left-alone holders (brief + reason) and "left_alone_mib" their memory,
        "mig_uuid" the MIG instance (None for a whole GPU; MIG instances add "mig_profile"; a whole GPU in MIG mode that
        is not released adds "mig_in_use", its instances that hold memory or processes), "memory_note" why more
        used memory counts as idle (NVML memory info v1), "released" whether no target holds it and its used memory
        less left_alone_mib is at most max_used_mib (plus reserved_allowance_mib).

        Without any index map (no NVML, no /proc/driver/nvidia) there is one entry with index None for all GPUs.
        """
        split = self.split(view)
        if not view["gpus"]:
            return [_shapes.entry(_shapes.WAIT_GPU_KEYS, holders=[brief(h, None) for h in split["targets"]],
                                  left_alone=[dict(brief(h, None), reason=h["reason"]) for h in split["left_alone"]],
                                  left_alone_mib=0, foreign=[], suspects=[], memory_checked=False,
                                  reserved_allowance_mib=0, released=not split["targets"])]
        status = []
        # A hung driver leaves memory unknown: no GPU is released then, whatever /proc shows.
        timed_out = bool((view.get("driver") or {}).get("timed_out"))
        for gpu in view["gpus"]:
            index = gpu["index"]
            if self.indices is not None and index not in self.indices:
                continue
            if index in self.instances:
                status.extend(self._instance_status(gpu, split, max_used_mib, timed_out))
                continue
            holders = [brief(h, index) for h in split["targets"] if index in h["gpus"]]
            left = [dict(brief(h, index), reason=h["reason"]) for h in split["left_alone"] if index in h["gpus"]]
            left_mib = sum(h["memory_mib"] or 0 for h in left)
            if gpu["unexplained_mib"] and any(h["attribution"] == "device_file" for h in left):
                left_mib += gpu["unexplained_mib"]
            used = gpu["memory_used_mib"]
            checked = used is not None
            entry = _shapes.entry(
                _shapes.WAIT_GPU_KEYS, index=index, uuid=gpu.get("uuid"), memory_used_mib=used,
                memory_reserved_mib=gpu["memory_reserved_mib"], unexplained_mib=gpu["unexplained_mib"],
                memory_unexplained=gpu["memory_unexplained"], holders=holders, left_alone=left,
                left_alone_mib=left_mib, foreign=gpu["foreign"], suspects=gpu["suspects"],
                memory_checked=checked, error=gpu.get("error"), mig_uuid=None,
                reserved_allowance_mib=gpu.get("reserved_allowance_mib") or 0,
                memory_note=_v1_note(gpu),
                # A GPU the driver answers with an error (lost, fallen off the bus) is never "released".
                released=(not holders and not gpu.get("error") and not timed_out
                          and (not checked or used - left_mib <= max_used_mib + (gpu.get("reserved_allowance_mib") or 0))),
            )
            if not entry["released"] and gpu.get("mig_devices"):
                # A whole GPU in MIG mode that is not free: which of its instances hold memory or processes.
                entry["mig_in_use"] = [{key: device.get(key) for key in ("uuid", "profile", "memory_used_mib", "holder_pids")}
                                       for device in gpu["mig_devices"]
                                       if device.get("holder_pids") or (device.get("memory_used_mib") or 0) > max_used_mib]
            status.append(entry)
        return status

    def _instance_status(self, gpu, split, max_used_mib, timed_out):
        """gpu_status entries of the selected MIG instances of `gpu`: the figures of each instance (its memory, the
        holders of that instance), with "mig_uuid" and "mig_profile"."""
        index, key = gpu["index"], str(gpu["index"])
        devices = {device["uuid"]: device for device in gpu.get("mig_devices") or ()}
        status = []
        for uuid in sorted(self.instances[index]):
            device = devices.get(uuid)
            holders = [brief(h, index) for h in split["targets"] if uuid in (h.get("mig") or {}).get(key, ())]
            left = [dict(brief(h, index), reason=h["reason"]) for h in split["left_alone"]
                    if uuid in (h.get("mig") or {}).get(key, ())]
            left_mib = sum(h["memory_mib"] or 0 for h in left)
            device = device or {}
            error = gpu.get("error") or (None if device else
                                         "MIG device %s is no longer there (MIG reconfigured?)" % uuid)
            if device.get("unexplained_mib") and any(h["attribution"] == "device_file" for h in left):
                left_mib += device["unexplained_mib"]
            used = device.get("memory_used_mib")
            allowance = device.get("reserved_allowance_mib") or 0
            status.append({
                "index": index, "uuid": gpu.get("uuid"), "mig_uuid": uuid, "mig_profile": device.get("profile"),
                "memory_used_mib": used, "memory_reserved_mib": None, "unexplained_mib": device.get("unexplained_mib"),
                "memory_unexplained": device.get("memory_unexplained"), "holders": holders, "left_alone": left,
                "left_alone_mib": left_mib, "foreign": device.get("foreign", []), "suspects": gpu["suspects"],
                "memory_checked": used is not None, "error": error, "reserved_allowance_mib": allowance,
                "memory_note": _v1_note(device) if allowance else None,
                "released": (not holders and not error and not timed_out
                             and (used is None or used - left_mib <= max_used_mib + allowance)),
            })
        return status


def _v1_note(gpu):
    """What a GPU whose used memory includes reserved memory (NVML memory info v1) is held against, or None."""
    allowance = gpu.get("reserved_allowance_mib") or 0
    if not allowance:
        return None
    return ("reserved memory cannot be told apart on this driver (NVML memory info v1, whose used memory includes it): "
            "up to %d MiB (5%% of the memory) more counts as idle" % allowance)


def brief(holder, index):
    """The fields of a holder that a wait report needs, with its memory on GPU `index` and its parent."""
    key = None if index is None else str(index)
    return {"pid": holder["pid"], "comm": holder["comm"], "state": holder["state"], "cmdline": holder["cmdline"],
            "user": holder["user"], "memory_mib": holder["memory_mib"].get(key) if key else None,
            "attribution": holder.get("attribution", {}).get(key) if key else None, "parent": holder.get("parent")}
