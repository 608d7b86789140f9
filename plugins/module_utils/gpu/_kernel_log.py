# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The NVIDIA driver's Xid errors in the kernel log (/dev/kmsg), per GPU (docs/recovery.md).

The driver logs each Xid as `NVRM: Xid (PCI:0000:18:00): 79, pid=..., GPU has fallen off the bus.`: the GPU's PCI
domain, bus and device, then the Xid number. /dev/kmsg gives the kernel's records since boot (as far as its ring
buffer reaches), each `PRIORITY,SEQUENCE,MICROSECONDS,FLAGS;MESSAGE` with the microseconds since boot (Linux
Documentation/ABI/testing/dev-kmsg). A read of the device returns one record; with O_NONBLOCK, EAGAIN after the
last one; EPIPE where records were overwritten while reading. Standard library only; Python 3.9.
"""

from __future__ import annotations

import errno
import os
import re
import time
from typing import Dict, List, Optional, Tuple

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _shapes

KMSG = "/dev/kmsg"
# Bounds of one read of the log: its ring buffer is at most a few MiB (CONFIG_LOG_BUF_SHIFT, log_buf_len=).
MAX_BYTES = 32 * 1024 * 1024
DEADLINE_S = 2.0
_READ_SIZE = 8192  # more than a record's largest size (the kernel refuses a read shorter than the record: EINVAL)

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<domain>[0-9a-fA-F]{4,8}):(?P<bus>[0-9a-fA-F]{2}):(?P<device>[0-9a-fA-F]{2})"
    r"(?:\.[0-7])?\): (?P<xid>[0-9]+)(?:, (?P<text>.*))?$"
)

# The Xids that by themselves say the GPU needs a reset or the node a reboot, with why (docs/recovery.md cites each).
# Deliberately short: on drivers that have it, the driver's own recovery action (_recovery.py) says more.
XID_KINDS: Dict[int, Tuple[_shapes.XidNeed, str]] = {
    46: ("reset", "GPU stopped processing: NVIDIA's health checks drain the node and reset the GPU"),
    63: ("reset", "a row was marked for remapping, which a GPU reset applies"),
    79: (
        "reboot",
        "the GPU has fallen off the bus: it no longer answers, and only a reboot or power cycle brings it back",
    ),
}


def read(path: str = KMSG, deadline_s: float = DEADLINE_S) -> Tuple[List[Tuple[float, str]], Optional[str]]:
    """The kernel log's records as (seconds since boot, message), oldest first, and None; or ([], why) where it
    cannot be read (no such file, no permission: dmesg_restrict=1 needs CAP_SYSLOG)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        return [], "the kernel log %s cannot be read: %s" % (path, exc.strerror or exc)
    try:
        return _records(_read_all(fd, deadline_s)), None
    except OSError as exc:
        return [], "the kernel log %s cannot be read: %s" % (path, exc.strerror or exc)
    finally:
        os.close(fd)


def _read_all(fd: int, deadline_s: float) -> bytes:
    """Every record from `fd`: the device gives one per read and EAGAIN at the end; a regular file, EOF."""
    chunks: List[bytes] = []
    size = 0
    deadline = time.monotonic() + deadline_s
    while size < MAX_BYTES and time.monotonic() < deadline:
        try:
            chunk = os.read(fd, _READ_SIZE)
        except OSError as exc:
            if exc.errno == errno.EPIPE:  # records overwritten since the last read: go on from the oldest kept
                continue
            if exc.errno == errno.EAGAIN:
                break
            raise
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _records(data: bytes) -> List[Tuple[float, str]]:
    records: List[Tuple[float, str]] = []
    for line in data.decode("utf-8", "replace").splitlines():
        header, sep, message = line.partition(";")
        fields = header.split(",")
        if not sep or line.startswith(" ") or len(fields) < 3 or not fields[2].isdigit():
            continue  # a continuation line (" KEY=VALUE") or not a record
        records.append((int(fields[2]) / 1e6, message))
    return records


def xids(records: List[Tuple[float, str]], now_s: float) -> List[_shapes.Xid]:
    """The Xid lines of `records`, each with its GPU's PCI address (domain:bus:device, lower case), its age in
    seconds at `now_s` (seconds since boot) and, for the kinds of XID_KINDS, what it needs and why."""
    found: List[_shapes.Xid] = []
    for at_s, message in records:
        match = _XID.search(message)
        if not match:
            continue
        number = int(match.group("xid"))
        need, why = XID_KINDS.get(number, (None, None))
        found.append(
            {
                "xid": number,
                "pci": "%04x:%s:%s"
                % (int(match.group("domain"), 16) & 0xFFFF, match.group("bus").lower(), match.group("device").lower()),
                "age_s": round(max(now_s - at_s, 0.0), 1),
                "text": (match.group("text") or "").strip(),
                "needs": need,
                "why": why,
            }
        )
    return found


def pci_key(bus_id: Optional[str]) -> Optional[str]:
    """NVML's bus id (00000000:18:00.0) as the Xid line's address (0000:18:00); None where unknown."""
    if not bus_id:
        return None
    parts = bus_id.split(":")
    if len(parts) != 3:
        return None
    try:
        return "%04x:%02x:%02x" % (int(parts[0], 16) & 0xFFFF, int(parts[1], 16), int(parts[2].split(".")[0], 16))
    except ValueError:
        return None


def uptime_s(proc: str = "/proc") -> Optional[float]:
    """Seconds since boot (/proc/uptime), the clock of the log's records; None where unreadable."""
    try:
        with open(os.path.join(proc, "uptime")) as handle:
            return float(handle.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
