# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""/proc reading and safe signalling for the GPU check: the check's own oracle, independent of the
collection's /proc scanner (which is what it tests).

Only processes the check started are ever signalled, each pinned by (PID, start time in clock ticks,
field 22 of /proc/PID/stat) and, where the kernel has pidfds, through a pidfd opened while the
start time still matched.
"""

from __future__ import annotations

import os
import signal


def read_stat(pid, proc="/proc"):
    """{"state", "ppid", "start_ticks", "comm"} of `pid`, or None when it does not exist."""
    try:
        with open("%s/%d/stat" % (proc, pid), "rb") as stat_file:
            data = stat_file.read()
    except OSError:
        return None
    close = data.rindex(b")")
    fields = data[close + 2 :].split()
    return {
        "state": fields[0].decode(),
        "ppid": int(fields[1]),
        "start_ticks": int(fields[19]),
        "comm": data[data.index(b"(") + 1 : close].decode(errors="replace"),
    }


def nspids(pid, proc="/proc"):
    """The `NSpid:` entries of `pid` (its PID in each PID namespace, outermost first), or []."""
    try:
        with open("%s/%d/status" % (proc, pid)) as status:
            for line in status:
                if line.startswith("NSpid:"):
                    return [int(item) for item in line.split()[1:]]
    except OSError:
        pass
    return []


def descendants(root_pid, proc="/proc"):
    """PIDs of every live descendant of `root_pid` (children, grandchildren...), sorted."""
    children = {}
    for name in os.listdir(proc):
        if name.isdigit():
            stat = read_stat(int(name), proc)
            if stat:
                children.setdefault(stat["ppid"], []).append(int(name))
    found, todo = set(), [root_pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found)


def host_pid(ns_pid, root_pid, proc="/proc"):
    """The PID (in our namespace) of the descendant of `root_pid` whose innermost PID is `ns_pid`, or None.

    A process in a nested PID namespace reports getpid() from inside; NSpid maps it back.
    """
    for pid in descendants(root_pid, proc):
        entries = nspids(pid, proc)
        if len(entries) > 1 and entries[-1] == ns_pid:
            return pid
    return None


def device_files(pid, proc="/proc"):
    """Sorted distinct /dev/nvidia* paths that `pid` holds open (fds of every thread)."""
    paths = set()
    try:
        tasks = os.listdir("%s/%d/task" % (proc, pid))
    except OSError:
        return []
    for task in tasks:
        fd_dir = "%s/%d/task/%s/fd" % (proc, pid, task)
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink("%s/%s" % (fd_dir, fd))
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                paths.add(target)
    return sorted(paths)


def device_mappings(pid, proc="/proc"):
    """The lines of /proc/PID/maps that map a /dev/nvidia* file, as the kernel writes them
    ("address perms offset dev inode pathname"; a CUDA process maps its device, NVML never does), or []."""
    try:
        with open("%s/%d/maps" % (proc, pid), "rb") as maps:
            data = maps.read()
    except OSError:
        return []
    lines = []
    for line in data.decode(errors="replace").splitlines():
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/dev/nvidia"):
            lines.append(" ".join(fields))
    return lines


def mapped_paths(lines):
    """Sorted distinct pathnames of device_mappings() lines."""
    return sorted({line.split(None, 5)[5] for line in lines})


def device_fd_counts(pid, proc="/proc"):
    """{path: number of fds} of the /dev/nvidia* files `pid` holds open, as the probes counted them (its fd table,
    /proc/PID/fd; a real CUDA context holds /dev/nvidiaN some 20 times, an NVML client once), or {}."""
    counts = {}
    try:
        fds = os.listdir("%s/%d/fd" % (proc, pid))
    except OSError:
        return counts
    for fd in fds:
        try:
            target = os.readlink("%s/%d/fd/%s" % (proc, pid, fd))
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            counts[target] = counts.get(target, 0) + 1
    return dict(sorted(counts.items()))


def device_record(pid, proc="/proc"):
    """What a process shows of the driver, as the probes recorded it: {"pid", "fds" (device_fd_counts), "maps"
    (device_mappings lines)}."""
    return {"pid": pid, "fds": device_fd_counts(pid, proc), "maps": device_mappings(pid, proc)}


def maps_fields(line):
    """(perms, (major, minor) of the file's device, inode, path) of one /proc/PID/maps line ("rw-s", (0, 6), 142,
    "/dev/nvidia0"), or None for a line without a file."""
    fields = line.split(None, 5)
    if len(fields) < 6:
        return None
    try:
        major, minor = (int(part, 16) for part in fields[3].split(":"))
        inode = int(fields[4])
    except ValueError:
        return None
    return fields[1], (major, minor), inode, fields[5]


def file_identity(path):
    """((major, minor) of the file system's device, inode) of `path`, as /proc/PID/maps names a mapped file, or None."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return (os.major(status.st_dev), os.minor(status.st_dev)), status.st_ino


def processes_with(marker, proc="/proc"):
    """PIDs whose /proc/PID/cmdline contains `marker` (a string unique to one check run)."""
    found = []
    needle = marker.encode()
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open("%s/%s/cmdline" % (proc, name), "rb") as cmdline:
                if needle in cmdline.read():
                    found.append(int(name))
        except OSError:
            continue
    return sorted(found)


class Pinned:
    """One process the check started, pinned by PID and start time.

    Pinned(pid, popen=None): reads the start time now. alive() -> bool (a zombie is not alive);
    kill(sig) -> bool (False when the process is gone or its PID was reused); close().
    `popen` (a subprocess.Popen of this PID) is polled so that our own children get reaped.
    """

    def __init__(self, pid, popen=None, proc="/proc"):
        self.pid = pid
        self.popen = popen
        self.proc = proc
        stat = read_stat(pid, proc)
        self.start_ticks = stat["start_ticks"] if stat else None
        self.pidfd = None
        if stat and hasattr(os, "pidfd_open"):
            try:
                self.pidfd = os.pidfd_open(pid)
            except OSError:  # no pidfds here (old kernel, some sandboxes), or already gone
                self.pidfd = None
            if self.pidfd is not None and not self._same():
                os.close(self.pidfd)  # the PID was reused between the stat and the pidfd
                self.pidfd, self.start_ticks = None, None

    def _same(self):
        stat = read_stat(self.pid, self.proc)
        return stat is not None and stat["start_ticks"] == self.start_ticks

    def alive(self):
        if self.popen is not None and self.popen.poll() is not None:
            return False
        stat = read_stat(self.pid, self.proc)
        return (
            self.start_ticks is not None
            and stat is not None
            and stat["start_ticks"] == self.start_ticks
            and stat["state"] not in ("Z", "X")
        )

    def kill(self, sig=signal.SIGKILL):
        """Send `sig` if this is still our process; returns whether it was sent."""
        if self.start_ticks is None:
            return False
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, sig)
                return True
            if not self._same():
                return False
            os.kill(self.pid, sig)
            return True
        except ProcessLookupError:
            return False

    def close(self):
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def all_pids(proc="/proc"):
    """Every PID in `proc`, sorted."""
    return sorted(int(name) for name in os.listdir(proc) if name.isdigit())


def argv0(pid, proc="/proc"):
    """The basename of `pid`'s argv[0] ("nvidia-cuda-mps-server"), or None."""
    try:
        with open("%s/%d/cmdline" % (proc, pid), "rb") as cmdline:
            first = cmdline.read().split(b"\0", 1)[0]
    except OSError:
        return None
    return os.path.basename(first.decode(errors="replace")) or None


def environ(pid, proc="/proc"):
    """The raw /proc/PID/environ of `pid` (NUL-separated), or b"" where it cannot be read."""
    try:
        with open("%s/%d/environ" % (proc, pid), "rb") as environment:
            return environment.read()
    except OSError:
        return b""


def mem_available_bytes(meminfo="/proc/meminfo"):
    """MemAvailable of /proc/meminfo in bytes, or None."""
    try:
        with open(meminfo) as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
