# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What is selected: which holders of which GPUs are targets, and which are left alone and why.

The selection options (`gpus`, `pids`, `match`, `users`, the owner filters, `exclude`,
`include_protected`) are checked once by `check_options`, before the first look at the GPUs.
A `Selection` is then built from them and a snapshot (for the GPU indices and UUIDs). Among the
holders of the selected GPUs (docs/attribution.md: holding a GPU means holding its memory), each
is a target (gpu_kill ends it, gpu_wait waits for it) or left alone with a reason; device users
(NVML clients, NCCL workers' extra device files) are never holders and never selected.
Whether a GPU is released is decided in _release.
"""

from __future__ import annotations

import os
import pwd
import re
import stat
from typing import TYPE_CHECKING, Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Pattern, Set

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _proc
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._nothing import (
    OWNER_FILTERS,
    nothing_refusal,
    null_refusal,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._options import OptionError

# _owners (owner blocks, their filters) is imported where an owner filter is given: a module compiles every
# module_utils it imports (Ansible ships them as source), and most runs select by GPU alone.

if TYPE_CHECKING:
    from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._shapes import Snapshot

# Daemons that hold GPUs legitimately; never signalled unless the operator says so explicitly. Known by what they
# run, not by their title: the basename of the executable /proc/PID/exe points to (daemon_name). A title (exec -a,
# setproctitle, prctl PR_SET_NAME) changes argv[0] and comm, never the executable.
PROTECTED_NAMES = (
    # NVIDIA's daemons and tools (docs/attribution.md, "Protected by default").
    "nvidia-persistenced",
    "nv-hostengine",
    "dcgm-exporter",
    "nv-fabricmanager",
    "nvidia-fabricmanager",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
    "nvidia-device-plugin",
    "gpu-feature-discovery",
    "nvidia-mig-manager",
    "nvidia-smi",
    # Display servers (Ubuntu's /usr/lib/xorg/Xorg, Fedora's /usr/libexec/Xorg; /usr/bin/Xorg is a wrapper script).
    "Xorg",
    "Xwayland",
    "X",
    # Compositors and desktop shells, display managers and their sessions: a desktop's graphics contexts.
    "gnome-shell",
    "mutter",
    "kwin_wayland",
    "kwin_x11",
    "plasmashell",
    "sway",
    "weston",
    "gdm",
    "gdm3",
    "gdm-wayland-session",
    "gdm-x-session",
    "sddm",
    "sddm-helper",
    "sddm-greeter",
)
# The prefix of the reason of a holder left alone by the exclude option: the operator's choice, unlike the others.
EXCLUDED = "excluded by the exclude option"

# Options shared by every module that selects holders (gpu_kill, gpu_wait), beside `gpus`.
HOLDER_ARGS: Dict[str, Dict[str, Any]] = dict(
    pids=dict(type="list", elements="int"),
    pid_start_ticks=dict(type="dict"),
    match=dict(type="str"),
    users=dict(type="list", elements="str"),
    exclude=dict(type="list", elements="str", default=[]),
    include_protected=dict(type="bool", default=False),
    units=dict(type="list", elements="str"),
    containers=dict(type="list", elements="str"),
    pods=dict(type="list", elements="str"),
    slurm_jobs=dict(type="list", elements="str"),
)

_ASCII_INDEX = re.compile(r"[0-9]+")


class SelectionError(OptionError):
    """Bad selection input: an unknown GPU or user, an empty list, an invalid regex. Nothing was signalled."""


# A holder of a snapshot (_shapes.SnapshotHolder, with "owner" where owners were read); split adds "reason".
HolderLike = Mapping[str, Any]


def check_not_empty(**values: object) -> None:
    """Refuse a selection option that was given but selects nothing, before anything is signalled.

    Nothing is (names_nothing): an empty or blank string, an empty list, a list of nothing but null or blank entries.
    (A blank entry beside real ones is refused by the option's own check: an unknown GPU, user or PID.) Such a value
    must not widen the selection to "everything". None is an option left out, which means "any": a null given as
    such is refused on the controller (null_refusal), which alone can tell it from one left out.

    Args:
        values: option name -> value after Ansible's type checks.
    """
    refusal = nothing_refusal({name: value for name, value in values.items() if value is not None})
    if refusal:
        raise SelectionError(refusal)


class GpuIndices(List[int]):
    """The sorted NVML indices select_gpus selected (a list), with `instances`: {index: frozenset of MIG UUIDs} for
    the MIG-enabled GPUs of which only some MIG instances were selected (an index not in it: the whole GPU)."""

    def __init__(self, indices: Iterable[int] = (), instances: Optional[Mapping[int, FrozenSet[str]]] = None) -> None:
        super(GpuIndices, self).__init__(indices)
        self.instances: Dict[int, FrozenSet[str]] = dict(instances or {})


def select_gpus(requested: Optional[List[Any]], snapshot: Snapshot) -> Optional[GpuIndices]:
    """NVML indices selected by the `gpus` option (ASCII indices, GPU UUIDs or MIG UUIDs; None = all).

    Returns a GpuIndices (a sorted list of indices; a MIG UUID selects its parent's index and, in `instances`, that
    instance only, while the parent's index or GPU UUID selects every instance on it), or None for "all GPUs"
    (which also works when no index <-> minor map is known). Raises SelectionError for an empty list, an unknown
    index or UUID, or when specific GPUs are asked for but neither NVML nor /proc/driver/nvidia can map them.
    """
    if requested is None:
        return None
    check_not_empty(gpus=requested)
    if not snapshot["gpus"]:
        driver = snapshot.get("driver") or {}
        if driver.get("timed_out"):
            raise SelectionError(
                "cannot select GPUs %s: NVML did not answer, so GPU indices cannot be mapped to device files; the "
                "driver may be hung: look for Xid errors in the kernel log (dmesg), then reset the GPUs or reboot the "
                "host" % list(requested)
            )
        raise SelectionError(
            "cannot select GPUs %s: the NVIDIA driver library is not usable (%s) and there is no "
            "/proc/driver/nvidia to map GPU indices to device files; install or load the NVIDIA driver"
            % (list(requested), driver.get("error"))
        )
    by_uuid: Dict[str, int] = {}
    for gpu in snapshot["gpus"]:
        uuid = gpu.get("uuid")
        if uuid:
            by_uuid[uuid] = gpu["index"]
    by_mig_uuid = {device["uuid"]: gpu["index"] for gpu in snapshot["gpus"] for device in gpu.get("mig_devices") or ()}
    indices = {gpu["index"] for gpu in snapshot["gpus"]}
    selected: Set[int] = set()
    instances: Dict[int, Set[str]] = {}
    for item in requested:
        text: Optional[str] = str(item).strip()
        if isinstance(item, bool):
            text = None
        if text is not None and _ASCII_INDEX.fullmatch(text) and int(text) in indices:
            selected.add(int(text))
        elif text in by_uuid:
            selected.add(by_uuid[text])
        elif text in by_mig_uuid:
            instances.setdefault(by_mig_uuid[text], set()).add(text)
        else:
            raise SelectionError(
                "unknown GPU %r: give a GPU by its index (this host has %s), its UUID (%s) or a MIG UUID (%s)%s"
                % (
                    item,
                    ", ".join(str(index) for index in sorted(indices)),
                    _uuid_words(by_uuid),
                    _uuid_words(by_mig_uuid),
                    _bracket_hint(text),
                )
            )
    # A whole GPU selected as well as some of its instances: the whole GPU.
    partial = {index: frozenset(uuids) for index, uuids in instances.items() if index not in selected}
    return GpuIndices(sorted(selected | set(partial)), partial)


def _uuid_words(by_uuid: Mapping[str, int]) -> str:
    """The UUIDs of `by_uuid` (UUID -> GPU index) with their GPU's index, by index: "0: GPU-5ae9..., 1: GPU-1f12..."."""
    pairs = sorted((index, uuid) for uuid, index in by_uuid.items())
    return ", ".join("%d: %s" % pair for pair in pairs) or "none known"


def _bracket_hint(text: Optional[str]) -> str:
    """How to write a list where `text` is a piece of one written in brackets, as key=value arguments (ansible -a
    'gpus=[0,1]') pass it: one string, which the list type splits at commas into '[0' and '1]'."""
    if not text or not (text.startswith("[") or text.endswith("]")):
        return ""
    return (
        "; a list in brackets in key=value arguments (ansible -a 'gpus=[0,1]') reaches the module as text: write "
        "gpus=0,1 there, or give the arguments as JSON (-a '{\"gpus\": [0, 1]}')"
    )


def compile_match(pattern: Optional[str]) -> Optional[Pattern[str]]:
    """Compile the `match` regex (None = any), or raise SelectionError."""
    if pattern is None:
        return None
    check_not_empty(match=pattern)
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise SelectionError("invalid regex in match %r: %s" % (pattern, exc)) from None


def check_users(users: Optional[List[str]]) -> Optional[Set[str]]:
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
        raise SelectionError(
            "no such user on this host: %s (give user names that exist here, or UIDs)" % ", ".join(unknown)
        )
    return set(users)


def check_pids(pids: Optional[List[int]]) -> Optional[Set[int]]:
    """The PIDs of `pids` as a set, or None when not given; SelectionError for one that is not a positive PID."""
    if pids is None:
        return None
    check_not_empty(pids=pids)
    # A YAML `true` passes Ansible's int check as 1: PIDs are never booleans.
    bad = [pid for pid in pids if isinstance(pid, bool) or pid <= 0]
    if bad:
        raise SelectionError("pids must be positive process IDs, got %s" % ", ".join(str(p) for p in bad))
    return set(pids)


def check_start_ticks(ticks: Optional[Mapping[Any, Any]], pids: Optional[Set[int]]) -> Optional[Dict[int, int]]:
    """pid_start_ticks as {PID: start ticks}, or None when not given. Each key must be one of `pids` (pids must be
    given), each value a start time in clock ticks since boot (field 22 of /proc/PID/stat), a whole number >= 0."""
    if ticks is None:
        return None
    if pids is None:
        raise SelectionError("pid_start_ticks needs pids: give the PIDs whose start times it pins")
    found: Dict[int, int] = {}
    bad: List[str] = []
    for key, value in ticks.items():
        pid, start = str(key).strip(), str(value).strip()
        if not pid.isdigit() or int(pid) not in pids or isinstance(value, bool) or not start.isdigit():
            bad.append("%s: %s" % (key, value))
        else:
            found[int(pid)] = int(start)
    if bad:
        raise SelectionError(
            "pid_start_ticks maps PIDs of pids to start times in clock ticks (whole numbers), got %s" % ", ".join(bad)
        )
    return found


class Checked:
    """The selection options of one module run, checked once, before the first look at the GPUs."""

    # {PID: start ticks} (check_start_ticks) or None: a listed PID whose process started at another time is left alone.
    pid_start_ticks: Optional[Dict[int, int]] = None

    def __init__(
        self,
        gpus: Optional[List[Any]] = None,
        pids: Optional[Set[int]] = None,
        regex: Optional[Pattern[str]] = None,
        users: Optional[Set[str]] = None,
        owners: Optional[Mapping[str, Optional[List[str]]]] = None,
        exclude: Optional[Iterable[str]] = (),
        include_protected: bool = False,
    ) -> None:
        self.gpus = gpus
        self.pids = pids
        self.regex = regex
        self.users = users
        self.owners: Dict[str, Optional[List[str]]] = dict(owners or {})
        self.exclude = tuple(exclude or ())
        self.include_protected = include_protected


def check_options(params: Mapping[str, Any], given: Optional[Mapping[str, object]] = None) -> Checked:
    """Check the selection options that need no look at the GPUs, so bad input is refused even when the driver
    hangs. `given`: the arguments as given, where known (null_refusal); a module has only `params`, where a null
    option is None, as one left out (the action plugin refused nulls on the controller). Returns a Checked; raises
    SelectionError."""
    refusal = null_refusal(given) if given is not None else None
    if refusal:
        raise SelectionError(refusal)
    # The options whose own checks come later (gpus needs a look) or that have none; pids, match and users are
    # checked by check_pids, compile_match and check_users.
    check_not_empty(**{name: params.get(name) for name in ("gpus",) + OWNER_FILTERS})
    if params.get("containers"):
        from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners

        errors = _owners.container_ref_errors(params["containers"])
        if errors:
            raise SelectionError("; ".join(errors))
    checked = Checked(
        gpus=params.get("gpus"),
        pids=check_pids(params.get("pids")),
        regex=compile_match(params.get("match")),
        users=check_users(params.get("users")),
        owners={name: params.get(name) for name in OWNER_FILTERS},
        exclude=params.get("exclude"),
        include_protected=params.get("include_protected", False),
    )
    checked.pid_start_ticks = check_start_ticks(params.get("pid_start_ticks"), checked.pids)
    return checked


def ancestors(pid: Optional[int] = None, proc: str = "/proc") -> Set[int]:
    """PIDs of `pid` (default: this process) and all its ancestors up to PID 1."""
    chain: Set[int] = set()
    current = os.getpid() if pid is None else pid
    while current and current not in chain:
        chain.add(current)
        stat = _proc.read_stat(current, proc)
        current = stat["ppid"] if stat else 0
    return chain


def daemon_name(pid: int, start_ticks: Optional[int], proc: str = "/proc", owner: int = 0) -> Optional[str]:
    """The name in PROTECTED_NAMES that process `pid` runs, judged by its executable, or None.

    /proc/PID/exe names the file the kernel runs (a deleted one ends in " (deleted)", as after a package upgrade).
    Its basename must be one of PROTECTED_NAMES, and the file a regular one that only `owner` (root) could have put
    there: owned by it, writable by no one else. So `exec -a nvidia-persistenced python3` (exe python3) is not a
    daemon, and neither is a copy of a binary renamed by a user (owned by that user). None also when the process is
    gone, or its PID no longer names the process with `start_ticks`, or its exe cannot be read (another user's
    process, read without privileges).
    """
    path = "%s/%d/exe" % (proc, pid)
    try:
        target = os.readlink(path)
        found = os.stat(path)
    except OSError:
        return None
    if _proc.read_start_ticks(pid, proc) != start_ticks:
        return None
    name = os.path.basename(target[: -len(" (deleted)")] if target.endswith(" (deleted)") else target)
    trusted = (
        stat.S_ISREG(found.st_mode) and found.st_uid == owner and not found.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )
    return name if trusted and name in PROTECTED_NAMES else None


def protection(
    holder: HolderLike,
    own_chain: Set[int],
    exclude: Iterable[str] = (),
    include_protected: bool = False,
    proc: str = "/proc",
) -> Optional[str]:
    """Why `holder` must not be signalled, or None.

    Never: PID 1, kernel threads, this process and its ancestors (the Ansible process chain
    and the SSH session). By default also the daemons of PROTECTED_NAMES, by their executable
    (daemon_name), and the names in `exclude`; `include_protected=True` lifts PROTECTED_NAMES
    (never `exclude`).
    """
    pid: int = holder["pid"]
    if pid == 1:
        return "PID 1 (init)"
    if pid in own_chain:
        return "this module or one of its ancestors (Ansible, the SSH session)"
    if holder.get("kernel_thread"):
        return "kernel thread"
    excluded = _matching_names(holder, exclude)
    if excluded:
        return "%s (%s)" % (EXCLUDED, ", ".join(excluded))
    daemon = None if include_protected else daemon_name(pid, holder.get("start_ticks"), proc)
    if daemon:
        return "protected GPU daemon (%s)" % daemon
    return None


def _matching_names(holder: HolderLike, names: Iterable[str]) -> List[str]:
    """The names in `names` that are this process's name: its comm (which the kernel cuts to
    15 bytes) or the basename of its argv[0]."""
    comm: str = holder.get("comm") or ""
    cmdline: str = holder.get("cmdline") or ""
    argv0 = os.path.basename(cmdline.split(" ", 1)[0]) if cmdline else ""
    return sorted({name for name in names if name and (comm == name[:15] or argv0 == name)})


class Selection:
    """The selection options of one module run, checked; decides targets and what is left alone.

    Selection(indices, pids=None, regex=None, users=None, exclude=(), include_protected=False, own_chain=None)
    with indices from select_gpus (None = all GPUs), pids/users as sets or None (any), regex compiled or None.
    """

    # {PID: start ticks} or None (from_params sets it from Checked.pid_start_ticks).
    pid_start_ticks: Optional[Dict[int, int]] = None

    def __init__(
        self,
        indices: Optional[List[int]],
        pids: Optional[Set[int]] = None,
        regex: Optional[Pattern[str]] = None,
        users: Optional[Set[str]] = None,
        exclude: Optional[Iterable[str]] = (),
        include_protected: bool = False,
        own_chain: Optional[Set[int]] = None,
        owners: Optional[Mapping[str, Optional[List[str]]]] = None,
        proc: str = "/proc",
    ) -> None:
        self.indices = indices
        self.proc = proc
        # {index: MIG UUIDs} where only some MIG instances of a GPU are selected (select_gpus).
        self.instances: Dict[int, FrozenSet[str]] = getattr(indices, "instances", None) or {}
        self.owners = {name: value for name, value in (owners or {}).items() if value is not None}
        self.pids = pids
        self.regex = regex
        self.users = users
        self.exclude = tuple(exclude or ())
        self.include_protected = include_protected
        self.own_chain = ancestors() if own_chain is None else own_chain

    @classmethod
    def from_params(cls, params: Mapping[str, Any], snapshot: Snapshot, checked: Optional[Checked] = None) -> Selection:
        """The Selection of a module's options (`gpus` and HOLDER_ARGS; missing keys mean "any") on a snapshot.
        `checked` is check_options' result (checked here when None); raises SelectionError before anything is
        signalled."""
        checked = checked or check_options(params)
        containers = checked.owners.get("containers")
        if containers:
            from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners

            processes: List[HolderLike] = [*snapshot.get("holders", []), *snapshot.get("device_users", [])]
            known = {p["owner"]["container_id"] for p in processes if (p.get("owner") or {}).get("container_id")}
            errors = _owners.container_ref_errors(containers, known)
            if errors:
                raise SelectionError("; ".join(errors))
        selection = cls(
            select_gpus(checked.gpus, snapshot),
            pids=checked.pids,
            regex=checked.regex,
            users=checked.users,
            exclude=checked.exclude,
            include_protected=checked.include_protected,
            owners=checked.owners,
        )
        selection.pid_start_ticks = checked.pid_start_ticks
        return selection

    @property
    def narrowed(self) -> bool:
        """True when pids, match, users or an owner filter narrow the selection beyond GPUs."""
        return self.pids is not None or self.regex is not None or self.users is not None or bool(self.owners)

    def covers(self, holder: HolderLike) -> bool:
        """True when `holder` holds one of the selected GPUs (where MIG instances are selected: one of them)."""
        if self.indices is None:
            return True
        for index in set(self.indices) & set(holder["gpus"]):
            wanted = self.instances.get(index)
            if wanted is None or wanted & set((holder.get("mig") or {}).get(str(index), ())):
                return True
        return False

    def narrowing_reason(self, holder: HolderLike) -> Optional[str]:
        """Why pids, match, users or an owner filter leave this holder alone, or None (the protection rules aside)."""
        if self.pids is not None and holder["pid"] not in self.pids:
            return "not in pids"
        wanted = (self.pid_start_ticks or {}).get(holder["pid"])
        if wanted is not None and holder.get("start_ticks") != wanted:
            return "PID %d now names a process started at tick %s, not the one pid_start_ticks names (tick %d)" % (
                holder["pid"],
                holder.get("start_ticks"),
                wanted,
            )
        if self.regex is not None and not self.regex.search(holder.get("cmdline") or ""):
            return "command line does not match %r" % self.regex.pattern
        if self.users is not None and holder.get("user") not in self.users and str(holder.get("uid")) not in self.users:
            return "user %s not in users" % holder.get("user")
        if self.owners:
            from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _owners

            mismatch: Optional[str] = _owners.mismatch(holder.get("owner"), **self.owners)
            return mismatch
        return None

    def split(self, snapshot: Snapshot) -> Dict[str, List[Any]]:
        """{"targets": [holder], "left_alone": [holder + reason], "protected": [the left_alone entries that the
        protection rules or `exclude` leave alone, rather than pids, match, users or an owner filter], "counted": [the
        PIDs of those the protection rules leave alone, `exclude` aside: nobody chose to leave them out, so their
        memory counts in the release decision], "not_holding": [PIDs from `pids` that hold none of the selected
        GPUs]} for the holders of the selected GPUs in `snapshot`."""
        targets: List[HolderLike] = []
        left: List[Dict[str, Any]] = []
        protected: List[Dict[str, Any]] = []
        counted: List[int] = []
        covered = [h for h in snapshot["holders"] if self.covers(h)]
        for holder in covered:
            narrowed = self.narrowing_reason(holder)
            reason = narrowed or protection(holder, self.own_chain, self.exclude, self.include_protected, self.proc)
            if reason is None:
                targets.append(holder)
                continue
            left.append(dict(holder, reason=reason))
            if narrowed is None:
                protected.append(left[-1])
                if not reason.startswith(EXCLUDED):
                    counted.append(holder["pid"])
        not_holding = sorted((self.pids or set()) - {h["pid"] for h in covered})
        return {
            "targets": targets,
            "left_alone": left,
            "protected": protected,
            "counted": counted,
            "not_holding": not_holding,
        }
