# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Loopback TCP ports for servers the tests start (simulated vLLM instances share the host's network).

A port from bind(("127.0.0.1", 0)) is only free at that moment: a server bound seconds later (after a playbook
starts it) can find it taken by another pytest worker that got the same port, or by the source port of an outgoing
connection (the kernel takes those from the same range, /proc/sys/net/ipv4/ip_local_port_range). free_ports()
instead picks ports below that range and reserves each one for the life of this process with an flock on
$TMPDIR/gpuops-test-ports/<port>, so that no other worker, and no other test run on this machine, picks it too.
A port is also checked to be bindable when picked.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

RESERVATIONS = Path(tempfile.gettempdir()) / "gpuops-test-ports"
LOWEST = 20000
# Locks held by this process: {port: open file}. Closing a file (or the process exiting) frees its port.
_held: dict[int, object] = {}


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _reserve(port: int) -> bool:
    lock = open(os.open(RESERVATIONS / str(port), os.O_RDONLY | os.O_CREAT, 0o644))
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return False
    if not _bindable(port):
        lock.close()
        return False
    _held[port] = lock
    return True


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback TCP ports, free now and reserved for this process (see the module's docstring).

    Raises RuntimeError when the range below the ephemeral ports has no `count` free ports left."""
    RESERVATIONS.mkdir(mode=0o1777, exist_ok=True)
    candidates = [port for port in range(LOWEST, _ephemeral_low()) if port not in _held]
    random.shuffle(candidates)
    found = []
    for port in candidates:
        if _reserve(port):
            found.append(port)
            if len(found) == count:
                return found
    raise RuntimeError("no %d free ports in %d-%d" % (count, LOWEST, _ephemeral_low() - 1))
