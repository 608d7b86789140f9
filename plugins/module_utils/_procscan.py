# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the kernel says: which processes hold NVIDIA device files, from /proc.

A fuser-style scan of /proc: for every process, the fds of every thread
(/proc/PID/task/TID/fd) and its memory mappings (/proc/PID/maps), matched
against the NVIDIA device paths. psutil cannot do this (Process.open_files()
lists regular files only and never shows /dev/nvidia*), so we read /proc
ourselves. Readlink first: it is the cheapest call per fd.
"""
from __future__ import annotations

import errno
import os
import re

# /dev/nvidia<minor> (195:<minor>), the control and UVM devices, and MIG capabilities.
_DEVICE_RE = re.compile(r"^/dev/nvidia(?:(?P<minor>\d+)|ctl|-uvm|-uvm-tools|-modeset|-caps/.*)$")
_MAPS_MARK = b"/dev/nvidia"
_PF_KTHREAD = 0x00200000  # include/linux/sched.h: "I am a kernel thread"
# errno values that mean "the process or thread is gone, or not ours to read": skip it.
_SKIP_ERRNOS = (errno.ENOENT, errno.ESRCH, errno.EACCES, errno.EPERM, errno.ENOTDIR, errno.EINVAL)


class DeviceHandles:
    """The NVIDIA device files one process holds.

    Attributes:
        pid: process ID, in the PID namespace of the scanned /proc.
        minors: set of int, the N of each /dev/nvidiaN held (not the NVML index).
        control: True when it holds /dev/nvidiactl, /dev/nvidia-uvm*, /dev/nvidia-modeset or
            /dev/nvidia-caps/*: these say "uses the driver", not which GPU.
        seen_in: set of str, where it was seen: "fd" (a thread's open fd) and/or "mapping"
            (a line of /proc/PID/maps).
        thread_only: True when only a thread other than the main one holds a handle
            (fuser and lsof miss such a process).
    """

    __slots__ = ("pid", "minors", "control", "seen_in", "thread_only")

    def __init__(self, pid):
        self.pid = pid
        self.minors = set()
        self.control = False
        self.seen_in = set()
        self.thread_only = False

    def add(self, path, where):
        """Record one matching path (a readlink result or a maps pathname)."""
        match = _DEVICE_RE.match(path)
        if match is None:
            return False
        minor = match.group("minor")
        if minor is None:
            self.control = True
        else:
            self.minors.add(int(minor))
        self.seen_in.add(where)
        return True

    def as_dict(self):
        """Plain-data view: {"pid", "minors" (sorted list), "control", "seen_in" (sorted), "thread_only"}."""
        return {
            "pid": self.pid,
            "minors": sorted(self.minors),
            "control": self.control,
            "seen_in": sorted(self.seen_in),
            "thread_only": self.thread_only,
        }


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError as exc:
        if exc.errno in _SKIP_ERRNOS:
            return None
        raise


def _scan_fd_dir(fd_dir, names, handles):
    found = False
    for name in names:
        try:
            target = os.readlink(fd_dir + name)
        except OSError as exc:
            if exc.errno in _SKIP_ERRNOS:
                continue
            raise
        # Cheap prefix test before the regex: most fds are sockets, pipes and files.
        if target.startswith("/dev/nvidia") and handles.add(target, "fd"):
            found = True
    return found


def _scan_maps(proc, pid, handles):
    try:
        with open("%s/%d/maps" % (proc, pid), "rb") as maps:
            data = maps.read()
    except OSError as exc:
        if exc.errno in _SKIP_ERRNOS:
            return
        raise
    if _MAPS_MARK not in data:
        return
    for line in data.splitlines():
        if _MAPS_MARK in line:
            # address perms offset dev inode pathname
            fields = line.split(None, 5)
            if len(fields) == 6:
                handles.add(fields[5].decode("utf-8", "replace"), "mapping")


def scan_process(pid, proc="/proc"):
    """Scan one process; return its DeviceHandles, or None when it holds no NVIDIA device file.

    Reads /proc/PID/fd, the fd tables of its other threads where they differ (a thread can
    run with its own fd table, and a process whose main thread exited has an empty
    /proc/PID/fd while its other threads still hold files), and /proc/PID/maps.
    A process that vanished or cannot be read yields None.
    """
    handles = DeviceHandles(pid)
    base = "%s/%d/" % (proc, pid)
    leader_fds = _listdir(base + "fd")
    leader_holds = bool(leader_fds) and _scan_fd_dir(base + "fd/", leader_fds, handles)
    tids = _listdir(base + "task")
    if tids and len(tids) > 1:
        leader = set(leader_fds or ())
        for tid in tids:
            if tid == str(pid):
                continue
            task_fd = "%stask/%s/fd/" % (base, tid)
            names = _listdir(task_fd)
            # Threads normally share the leader's fd table (CLONE_FILES): an identical
            # set of fd numbers is taken as the same table, to avoid re-reading it per
            # thread. Only a table that differs is read again.
            if not names or set(names) == leader:
                continue
            if _scan_fd_dir(task_fd, names, handles) and not leader_holds:
                handles.thread_only = True
    _scan_maps(proc, pid, handles)
    if not handles.seen_in:
        return None
    return handles


def list_pids(proc="/proc"):
    """PIDs of the scanned /proc, as ints (threads are not listed)."""
    return [int(name) for name in os.listdir(proc) if name.isdigit()]


def scan_holders(proc="/proc", skip_pids=()):
    """Every process holding an NVIDIA device file: {pid: DeviceHandles}.

    Args:
        proc: the /proc to read (its PID namespace is the one PIDs refer to).
        skip_pids: PIDs not to scan (for example our own process and its NVML worker).
    """
    skip = set(skip_pids)
    holders = {}
    for pid in list_pids(proc):
        if pid in skip:
            continue
        handles = scan_process(pid, proc)
        if handles is not None:
            holders[pid] = handles
    return holders


def read_stat(pid, proc="/proc"):
    """Fields of /proc/PID/stat, or None if the process is gone.

    Returns {"comm" (the kernel's name, cut to 15 bytes), "state" (one letter: R, S, D, Z...),
    "ppid", "pgid", "sid", "start_ticks" (field 22: start time in clock ticks since boot),
    "kernel_thread" (PF_KTHREAD in field 9, the flags)}.
    PID plus start_ticks identify a process: a reused PID has another start time.
    """
    try:
        with open("%s/%d/stat" % (proc, pid), "rb") as stat:
            data = stat.read()
    except OSError as exc:
        if exc.errno in _SKIP_ERRNOS:
            return None
        raise
    # comm (field 2) may contain spaces and parentheses: split after the last ')'.
    close = data.rindex(b")")
    fields = data[close + 2:].split()
    return {"comm": data[data.index(b"(") + 1:close].decode("utf-8", "replace"), "state": fields[0].decode(),
            "ppid": int(fields[1]), "pgid": int(fields[2]), "sid": int(fields[3]), "start_ticks": int(fields[19]),
            "kernel_thread": bool(int(fields[6]) & _PF_KTHREAD)}


def read_start_ticks(pid, proc="/proc"):
    """Start time of PID in clock ticks since boot (field 22 of /proc/PID/stat), or None if gone."""
    stat = read_stat(pid, proc)
    return None if stat is None else stat["start_ticks"]


def read_nspids(pid, proc="/proc"):
    """The NSpid line of /proc/PID/status: PIDs from the outermost to the innermost namespace."""
    try:
        with open("%s/%d/status" % (proc, pid), "r") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except OSError as exc:
        if exc.errno in _SKIP_ERRNOS:
            return []
        raise
    return [pid]


def proc_driver_minors(proc="/proc"):
    """GPUs known to the kernel module, from /proc/driver/nvidia/gpus/*/information.

    Used when the NVML library is missing but the kernel driver is loaded. Returns a list of
    {"pci_bus_id", "minor", "uuid", "name"} sorted by PCI bus id (NVML's default enumeration
    order); [] when the kernel module is not loaded.
    """
    base = os.path.join(proc, "driver", "nvidia", "gpus")
    gpus = []
    for bus in sorted(_listdir(base) or ()):
        # The directory is named 0000:18:00.0; NVML writes the domain with 8 digits.
        info = {"pci_bus_id": bus.rjust(16, "0"), "minor": None, "uuid": None, "name": None}
        try:
            with open(os.path.join(base, bus, "information")) as handle:
                for line in handle:
                    key, _colon, value = line.partition(":")
                    key, value = key.strip(), value.strip()
                    if key == "Device Minor":
                        info["minor"] = int(value)
                    elif key == "GPU UUID":
                        info["uuid"] = value
                    elif key == "Model":
                        info["name"] = value
        except (OSError, ValueError):
            continue
        if info["minor"] is not None:
            gpus.append(info)
    return gpus
