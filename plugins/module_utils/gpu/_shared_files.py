# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which processes share the open NVIDIA device files of one creator: the forked workers of one dead trainer.

A driver client (a CUDA context) lives until the last process holding the file it was made on closes it
(docs/attribution.md, "What the driver lists"). A forked child shares its parent's open file descriptions; a process
that opened the device files itself does not. So the holders of exited creators' contexts fall into groups, one per
creator whose files they inherited, and each group keeps at least one context alive. The driver does not say which
group holds which creator's context, and no /proc file shows an open file description: kcmp(2) with KCMP_FILE tells
whether two processes' fds are one (Linux 3.5; CONFIG_KCMP, set with CONFIG_CHECKPOINT_RESTORE and, since Linux 5.12,
selected by DRM; it needs PTRACE_MODE_READ on both processes, which root has). Used by the snapshot (_gpus) for the
GPUs that carry exited creators' contexts; where kcmp does not answer, the groups are unknown (docs/attribution.md).
"""

from __future__ import annotations

import ctypes
import os
import platform
from typing import Dict, List, Optional, Sequence

# kcmp's system call number per machine (__NR_kcmp: asm/unistd_64.h on x86_64, asm-generic/unistd.h on arm64, the
# kernel's syscall tables of powerpc and s390).
_KCMP = {"x86_64": 312, "aarch64": 272, "arm64": 272, "ppc64le": 354, "s390x": 343}
_KCMP_FILE = 0
# A device file of the NVIDIA driver, by the name its fd's link gives: /dev/nvidiactl, /dev/nvidiaN, or one bound
# elsewhere (the GPU Operator's /run/nvidia/driver/dev/nvidia0).
_MARK = "nvidia"


class CannotTell(Exception):
    """kcmp is missing or refused, or a process could not be read: the groups are unknown."""


def _syscall() -> Optional[int]:
    return _KCMP.get(platform.machine())


def device_fds(pid: int, proc: str = "/proc") -> Dict[str, List[int]]:
    """{link target: [fd numbers]} of the NVIDIA device files `pid` has open (its fd table). Raises CannotTell where
    the table cannot be read or holds none (a holder may keep a context through a mapping alone)."""
    base = "%s/%d/fd" % (proc, pid)
    found: Dict[str, List[int]] = {}
    try:
        names = os.listdir(base)
    except OSError as exc:
        raise CannotTell("cannot read %s: %s" % (base, exc.strerror))
    for name in names:
        try:
            target = os.readlink("%s/%s" % (base, name))
        except OSError:
            continue
        if _MARK in target.rsplit("/", 1)[-1] and not target.endswith(" (deleted)") and "uvm" not in target:
            found.setdefault(target, []).append(int(name))
    if not found:
        raise CannotTell("PID %d has no NVIDIA device file open" % pid)
    return found


class _Kcmp:
    """kcmp(KCMP_FILE) through libc's syscall()."""

    def __init__(self) -> None:
        number = _syscall()
        if number is None:
            raise CannotTell("kcmp: unknown system call number on %s" % platform.machine())
        self.number = number
        self.libc = ctypes.CDLL(None, use_errno=True)

    def same(self, pid1: int, fd1: int, pid2: int, fd2: int) -> Optional[bool]:
        """True when the fds are one open file description, False when not, None when fd1 or fd2 was closed."""
        answer = int(self.libc.syscall(self.number, pid1, pid2, _KCMP_FILE, fd1, fd2))
        if answer >= 0:
            return answer == 0
        error = ctypes.get_errno()
        if error == 9:  # EBADF: closed since it was read
            return None
        raise CannotTell("kcmp(%d, %d): %s" % (pid1, pid2, os.strerror(error)))


def _share(kcmp: _Kcmp, one: int, files: Dict[str, List[int]], other: int, theirs: Dict[str, List[int]]) -> bool:
    """Whether processes `one` and `other` share an open NVIDIA device file. A forked child keeps its parent's fd
    numbers: those that both have open to the same file are compared, or where none has the same number, all of them."""
    for target in set(files) & set(theirs):
        mine, yours = files[target], theirs[target]
        pairs = [(fd, fd) for fd in mine if fd in yours] or [(a, b) for a in mine for b in yours]
        if any(kcmp.same(one, a, other, b) for a, b in pairs):
            return True
    return False


def groups(pids: Sequence[int], proc: str = "/proc") -> Optional[List[List[int]]]:
    """`pids` in groups of processes that share an open NVIDIA device file (kcmp), each group sorted, in the order of
    their first PID; None where that cannot be told (kcmp missing or refused, a process that has no device file open
    or that cannot be read). One PID or none need no kcmp."""
    pids = sorted(set(pids))
    if len(pids) < 2:
        return [[pid] for pid in pids]
    try:
        kcmp = _Kcmp()
        files = {pid: device_fds(pid, proc) for pid in pids}
        found: List[List[int]] = []
        for pid in pids:
            joined = [group for group in found if _share(kcmp, group[0], files[group[0]], pid, files[pid])]
            merged = sorted({member for group in joined for member in group} | {pid})
            found = [group for group in found if group not in joined] + [merged]
    except CannotTell:
        return None
    return sorted(found)
