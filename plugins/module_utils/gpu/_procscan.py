# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the kernel says: which processes hold NVIDIA device files, from /proc.

A fuser-style scan of /proc: for every process, the fds of every thread
(/proc/PID/task/TID/fd) and its memory mappings (/proc/PID/maps), matched
against the NVIDIA device files. A file is an NVIDIA device by its identity, not its path: a character device of
major 195 (the minor is the GPU's; 255 is nvidiactl, 254 nvidia-modeset), or the same file as one of /dev/nvidia*
(a bind mount elsewhere: /run/nvidia/driver/dev/nvidia0 under the GPU Operator's driver container), or by name for
nvidia-uvm* and nvidia-caps/* (their major is dynamic). Paths outside /dev are looked at when their name contains
"nvidia". psutil cannot do this (Process.open_files()
lists regular files only and never shows /dev/nvidia*), so we read /proc
ourselves. The cost is one readlink per fd and one read of every maps file:
fds are read by number where the fd directory's size gives their count (no
listing), and large scans are shared by forked worker processes. Also the kernel module's own tables
(/proc/driver/nvidia/gpus, /proc/driver/nvidia-caps/mig-minors). What one process is (stat, argv, identity) is
`_proc`'s; this module is imported only by a look that scans (`_gpus`).
"""

from __future__ import annotations

import functools
import json
import os
import re
import select
import signal
import stat
import time
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple, TypedDict, Union

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _proc

# /dev/nvidia<minor> (195:<minor>), the control and UVM devices, and MIG capabilities.
_DEVICE_RE = re.compile(
    r"^/dev/nvidia(?:(?P<minor>\d+)|ctl|-uvm|-uvm-tools|-modeset|-caps/(?:nvidia-cap(?P<cap>\d+))?.*)$"
)
_DEVICE_PREFIX = "/dev/nvidia"
# Any path that may name an NVIDIA device file (under /dev or bound elsewhere).
_NAME_MARK = "nvidia"
_MAPS_MARK = b"nvidia"
# The character major of /dev/nvidia<minor>, /dev/nvidiactl (255) and /dev/nvidia-modeset (254) (kernel-open/nvidia
# nv.c: NV_MAJOR_DEVICE_NUMBER 195, NV_MINOR_DEVICE_NUMBER_CONTROL_DEVICE 255).
_NVIDIA_MAJOR = 195
_CONTROL_MINORS = {255: "/dev/nvidiactl", 254: "/dev/nvidia-modeset"}
# nvidia-uvm and the MIG capability files have dynamic majors: they are known by name wherever they are.
_NAMED_RE = re.compile(r"/(nvidia-uvm(?:-tools)?|nvidia-caps/nvidia-cap\d+)$")
# What the kernel adds to the path of an fd's or a mapping's file that was unlinked (d_path).
_DELETED = " (deleted)"
# {(st_dev, st_ino): /dev path} of the device files under /dev, read once per process (see _known_files).
_KNOWN: Dict[str, Dict[Tuple[int, int], str]] = {}
# Per proc root: does st_size of PROC/PID/fd count the open fds? (see _size_counts_fds)
_SIZE_COUNTS_FDS: Dict[str, bool] = {}
# "0", "1", "2"...: fd numbers as names, grown on demand (see _fd_names)
_FD_NAMES: List[str] = []
# Holes in an fd table read by number before listing the directory instead (see _probe_fds)
_MAX_HOLES = 16
# (fd names, their link targets) of one fd table.
FdTable = Tuple[List[str], List[str]]
# {cap minor: (GPU minor, GPU instance id, compute instance id or None)}: what a MIG capability file grants.
CapMap = Dict[int, Tuple[int, int, Optional[int]]]


class HandlesDict(TypedDict):
    """DeviceHandles.as_dict(): sets as sorted lists."""

    pid: int
    minors: List[int]
    mapped: List[int]
    contexts: List[int]
    ctl: bool
    ctl_rw: bool
    uvm: bool
    control: bool
    seen_in: List[str]
    thread_only: bool
    caps: List[int]


class KernelGpu(TypedDict):
    """A GPU the kernel module knows (proc_driver_minors)."""

    pci_bus_id: str
    minor: Optional[int]
    uuid: Optional[str]
    name: Optional[str]


class DeviceHandles:
    """The NVIDIA device files one process holds.

    Attributes:
        pid: process ID, in the PID namespace of the scanned /proc.
        minors: set of int, the N of each /dev/nvidiaN held (not the NVML index), by fd or mapping.
        mapped: set of int, the minors of the /dev/nvidiaN files it maps in any way (cuInit maps two write-only
            64 KiB doorbells; an NVML client maps nothing).
        contexts: set of int, the minors of the /dev/nvidiaN files it maps read-write and shared (`rw-s` in
            /proc/PID/maps): a CUDA context's GPU memory mapping, the evidence of a context (docs/attribution.md).
        ctl: True when it holds /dev/nvidiactl (every driver client does, NVML ones included).
        ctl_rw: True when it maps /dev/nvidiactl read-write and shared: a context's system memory (on a
            zero-framebuffer GPU, such as a GB10, all of its memory); nvidia-smi and cuInit map it read-only.
        uvm: True when it holds /dev/nvidia-uvm or /dev/nvidia-uvm-tools (CUDA and NVML clients both do: not
            evidence of anything on a real driver).
        control: True when it holds /dev/nvidiactl, /dev/nvidia-uvm*, /dev/nvidia-modeset or
            /dev/nvidia-caps/*: these say "uses the driver", not which GPU.
        seen_in: set of str, where it was seen: "fd" (a thread's open fd) and/or "mapping"
            (a line of /proc/PID/maps).
        thread_only: True when only a thread other than the main one holds a handle
            (fuser and lsof miss such a process).
        caps: set of int, the N of each /dev/nvidia-caps/nvidia-capN held: a CUDA process on a MIG
            instance has the capability files of its GPU instance and compute instance open (see cap_map).
    """

    __slots__ = (
        "pid",
        "minors",
        "mapped",
        "contexts",
        "ctl",
        "ctl_rw",
        "uvm",
        "control",
        "seen_in",
        "thread_only",
        "caps",
    )

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.minors: Set[int] = set()
        self.mapped: Set[int] = set()
        self.contexts: Set[int] = set()
        self.ctl = False
        self.ctl_rw = False
        self.uvm = False
        self.control = False
        self.seen_in: Set[str] = set()
        self.thread_only = False
        self.caps: Set[int] = set()

    def add(self, path: str, where: str, perms: str = "") -> bool:
        """Record one matching path (a readlink result, or a maps pathname with its permissions: "rw-s")."""
        match = _DEVICE_RE.match(path)
        if match is None:
            return False
        minor = match.group("minor")
        shared_rw = perms[:2] == "rw" and perms[3:4] == "s"
        if minor is None:
            self.control = True
            if path == "/dev/nvidiactl":
                self.ctl = True
                self.ctl_rw = self.ctl_rw or shared_rw
            elif path.startswith("/dev/nvidia-uvm"):
                self.uvm = True
            elif match.group("cap") is not None:
                self.caps.add(int(match.group("cap")))
        else:
            self.minors.add(int(minor))
            if where == "mapping":
                self.mapped.add(int(minor))
                if shared_rw:
                    self.contexts.add(int(minor))
        self.seen_in.add(where)
        return True

    @property
    def cuda(self) -> bool:
        """True for a CUDA user: it maps a GPU's device file (cuInit's doorbells, a context). NVML clients and
        nvidia-smi map none (nvidia-smi maps nvidiactl read-only)."""
        return bool(self.mapped)

    def context_on(self, minor: int, zero_fb: bool = False) -> bool:
        """True when this process shows a context on the GPU of `minor`: an `rw-s` mapping of its /dev/nvidiaN.
        On a zero-framebuffer GPU (`zero_fb`) a context's memory is system memory, mapped through nvidiactl: there
        an `rw-s` nvidiactl mapping beside a mapping of the GPU's file is the evidence (docs/attribution.md)."""
        if minor in self.contexts:
            return True
        return zero_fb and self.ctl_rw and minor in self.mapped

    def as_dict(self) -> HandlesDict:
        """Plain-data view: {"pid", "minors", "mapped", "contexts" (sorted lists), "ctl", "ctl_rw", "uvm", "control",
        "seen_in" (sorted), "thread_only", "caps" (sorted)}."""
        return {
            "pid": self.pid,
            "minors": sorted(self.minors),
            "mapped": sorted(self.mapped),
            "contexts": sorted(self.contexts),
            "ctl": self.ctl,
            "ctl_rw": self.ctl_rw,
            "uvm": self.uvm,
            "control": self.control,
            "seen_in": sorted(self.seen_in),
            "thread_only": self.thread_only,
            "caps": sorted(self.caps),
        }

    @classmethod
    def from_dict(cls, data: HandlesDict) -> DeviceHandles:
        """The DeviceHandles whose as_dict() is `data`."""
        handles = cls(data["pid"])
        handles.minors = set(data["minors"])
        handles.mapped = set(data["mapped"])
        handles.contexts = set(data["contexts"])
        handles.ctl = data["ctl"]
        handles.ctl_rw = data["ctl_rw"]
        handles.uvm = data["uvm"]
        handles.control = data["control"]
        handles.seen_in = set(data["seen_in"])
        handles.thread_only = data["thread_only"]
        handles.caps = set(data.get("caps", ()))
        return handles


def _listdir(path: Union[str, int]) -> Optional[List[str]]:
    try:
        return os.listdir(path)
    except OSError as exc:
        if _proc.skip_error(exc):
            return None
        raise


def _readlinks(dir_fd: int, names: List[str]) -> FdTable:
    """(names, targets) of the fd entries `names` of the open fd directory `dir_fd`; vanished ones left out."""
    readlink = os.readlink
    try:
        return names, [readlink(name, dir_fd=dir_fd) for name in names]
    except OSError as exc:
        if not _proc.skip_error(exc):
            raise
    kept, targets = [], []
    for name in names:
        try:
            targets.append(readlink(name, dir_fd=dir_fd))
        except OSError as exc:
            if not _proc.skip_error(exc):
                raise
            continue
        kept.append(name)
    return kept, targets


def _fd_names(count: int) -> List[str]:
    """["0", "1", ...]: at least `count` fd numbers as directory entry names (built once, reused)."""
    if len(_FD_NAMES) < count:
        _FD_NAMES.extend(str(number) for number in range(len(_FD_NAMES), count))
    return _FD_NAMES


def _probe_fds(dir_fd: int, count: int) -> Optional[FdTable]:
    """Read fds 0, 1, 2... of the open fd directory `dir_fd` until `count` are found, without listing it.

    Listing a /proc fd directory costs a third or more of reading every link, and fd tables are nearly
    always dense (open() returns the lowest free number), so numbers are read in runs, each as long as
    the fds still missing; a run that hits a hole is read again up to the hole, and the next run starts
    after it. Returns (names, targets), or None after _MAX_HOLES holes, past 2 * count + 64 numbers, or
    when fds close meanwhile: then list the directory.
    """
    budget = 2 * count + 64
    numbers = _fd_names(budget)
    readlink = os.readlink
    names: List[str] = []
    targets: List[str] = []
    start = holes = 0
    while len(targets) < count:
        run = numbers[start : start + count - len(targets)]
        try:
            read = [readlink(name, dir_fd=dir_fd) for name in run]
        except OSError as exc:
            if not _proc.skip_error(exc):
                raise
            missing = int(exc.filename)
        else:
            targets += read
            names += run
            continue
        holes += 1
        if holes > _MAX_HOLES or missing + count - len(targets) >= budget:
            return None
        present = numbers[start:missing]
        try:
            targets += [readlink(name, dir_fd=dir_fd) for name in present]
        except OSError as exc:
            if not _proc.skip_error(exc):
                raise
            return None
        names += present
        start = missing + 1
    return names, targets


def _size_counts_fds(proc: str) -> bool:
    """True when st_size of PROC/PID/fd is the number of open fds (procfs of Linux >= 6.2).

    Checked once per proc root on our own fd directory: opening a pipe must add exactly 2.
    Older kernels report 0; a directory that is not procfs reports something else.
    """
    if proc not in _SIZE_COUNTS_FDS:
        fd_dir = "%s/%d/fd" % (proc, os.getpid())
        try:
            before = os.stat(fd_dir).st_size
            read_end, write_end = os.pipe()
            try:
                after = os.stat(fd_dir).st_size
            finally:
                os.close(read_end)
                os.close(write_end)
            _SIZE_COUNTS_FDS[proc] = before > 0 and after == before + 2
        except OSError:
            _SIZE_COUNTS_FDS[proc] = False
    return _SIZE_COUNTS_FDS[proc]


def _fd_table(fd_dir: str, size_counts_fds: bool) -> Optional[FdTable]:
    """(names, targets) of the fds open in `fd_dir` (/proc/PID/fd or /proc/PID/task/TID/fd).

    None when it cannot be read (the process vanished, or is not ours). Where the directory's
    size is its number of fds, the fds are read by number without listing the directory.
    """
    try:
        dir_fd = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        if _proc.skip_error(exc):
            return None
        raise
    try:
        if size_counts_fds:
            table = _probe_fds(dir_fd, os.fstat(dir_fd).st_size)
            if table is not None:
                return table
        return _readlinks(dir_fd, os.listdir(dir_fd))
    except OSError as exc:
        if _proc.skip_error(exc):
            return None
        raise
    finally:
        os.close(dir_fd)


def _known_files(dev: str = "/dev") -> Dict[Tuple[int, int], str]:
    """{(st_dev, st_ino): path} of DEV/nvidia* and DEV/nvidia-caps/*: the files a bind mount elsewhere is the same as."""
    if dev not in _KNOWN:
        known = {}
        for directory in (dev, os.path.join(dev, "nvidia-caps")):
            for name in _listdir(directory) or ():
                if name.startswith("nvidia"):
                    path = os.path.join(directory, name)
                    try:
                        info = os.stat(path)
                    except OSError:
                        continue
                    known[(info.st_dev, info.st_ino)] = "/dev/" + os.path.relpath(path, dev)
        _KNOWN[dev] = known
    return _KNOWN[dev]


def _canonical(path: str, info: Optional[Union[os.stat_result, _Identity]]) -> Optional[str]:
    """The /dev path an NVIDIA device file outside /dev, or unlinked, stands for (`info`: its stat), or None when it is
    none."""
    named = _NAMED_RE.search(path[: -len(_DELETED)] if path.endswith(_DELETED) else path)
    if named:
        return "/dev/" + named.group(1)
    if info is None:
        return None
    if stat.S_ISCHR(info.st_mode) and os.major(info.st_rdev) == _NVIDIA_MAJOR:
        minor = os.minor(info.st_rdev)
        return _CONTROL_MINORS.get(minor, "/dev/nvidia%d" % minor)
    return _known_files().get((info.st_dev, info.st_ino))


def _stat(path: str) -> Optional[os.stat_result]:
    try:
        return os.stat(path)
    except OSError:
        return None


def _record_fds(
    targets: List[str], handles: DeviceHandles, fd_dir: Optional[str] = None, names: Sequence[str] = ()
) -> bool:
    """Record the NVIDIA device files among fd `targets` (of `names` in `fd_dir`) in `handles`; True if there was one."""
    # One search of all targets joined (in C) first: nearly every process holds none.
    if _NAME_MARK not in "\n".join(targets):
        return False
    found = False
    for position, target in enumerate(targets):
        if _NAME_MARK not in target:
            continue
        if _DEVICE_RE.match(target) is None:
            # Outside /dev, or a device file unlinked since it was opened ("/dev/nvidia0 (deleted)": nvidia-modprobe
            # made the node again): the file itself says what it is (the fd's stat follows it in the holder's mount
            # namespace, also to an unlinked node: its st_rdev, 195:N).
            name = names[position] if fd_dir and position < len(names) else None
            canonical = _canonical(target, _stat("%s/%s" % (fd_dir, name)) if name else None)
            if canonical is None:
                continue
            target = canonical
        if handles.add(target, "fd"):
            found = True
    return found


def _maybe_other_threads(base: str) -> bool:
    """False when /proc/PID/task has exactly one entry, seen from its link count without listing it.

    procfs gives the task directory 2 + (number of threads) links, as ordinary file systems count
    2 + subdirectories; any other count (or a file system that reports 1) means: list it.
    """
    try:
        return os.stat(base + "task").st_nlink != 3
    except OSError as exc:
        if _proc.skip_error(exc):
            return False
        raise


def _read_maps(path: str) -> Optional[bytes]:
    """The contents of a maps file; None when it cannot be read (the process vanished, or is not ours)."""
    try:
        with open(path, "rb") as maps:
            return maps.read()
    except OSError as exc:
        if _proc.skip_error(exc):
            return None
        raise


def _address_space(proc: str, pid: int) -> Tuple[bytes, Optional[str]]:
    """(/proc/PID/maps, None), or where it is empty while other threads run, (a live thread's maps, its TID).

    A thread-group leader that has exited (state Z) while other threads run has no address space of its own: its
    maps file is empty, and /proc/PID/task/TID/maps of a live thread shows the one they share. Threads are looked at
    only then (empty maps: also kernel threads, which have no other threads)."""
    base = "%s/%d/" % (proc, pid)
    data = _read_maps(base + "maps")
    if data is None or data or not _maybe_other_threads(base):
        return data or b"", None
    for tid in _listdir(base + "task") or ():
        if tid != str(pid):
            thread = _read_maps("%stask/%s/maps" % (base, tid))
            if thread:
                return thread, tid
    return b"", None


def _scan_maps(proc: str, pid: int, handles: DeviceHandles) -> bool:
    """Record the NVIDIA device files mapped by process `pid` in `handles`; True when they were read from a thread's
    maps (a zombie leader's: _address_space) and there was one."""
    data, tid = _address_space(proc, pid)
    if _MAPS_MARK not in data:
        return False
    found = False
    for line in data.splitlines():
        if _MAPS_MARK in line:
            # address perms offset dev inode pathname
            fields = line.split(None, 5)
            if len(fields) != 6:
                continue
            named = fields[5].decode("utf-8", "replace")
            path = named if _DEVICE_RE.match(named) else _mapped_device(proc, pid, fields, named)
            if path is not None:
                found = handles.add(path, "mapping", fields[1].decode("ascii", "replace")) or found
    return found and tid is not None


def _mapped_device(proc: str, pid: int, fields: List[bytes], path: str) -> Optional[str]:
    """The /dev path of the NVIDIA device a maps line (`fields`) names by another `path`: a bind mount elsewhere (the
    line's device and inode), or a file unlinked since ("/dev/nvidia0 (deleted)"; its stat through
    /proc/PID/map_files/START-END, which follows it to the character device, 195:N); None when it is none."""
    identity = _maps_identity(fields[3], fields[4])
    if identity is None and path.endswith(_DELETED):
        return _canonical(path, _stat("%s/%d/map_files/%s" % (proc, pid, _map_files_name(fields[0]))))
    return _canonical(path, identity or _stat(path))


def _map_files_name(addresses: bytes) -> str:
    """The /proc/PID/map_files entry of a maps line's "start-end" (the kernel writes it there without leading zeros)."""
    start, _dash, end = addresses.partition(b"-")
    try:
        return "%x-%x" % (int(start, 16), int(end, 16))
    except ValueError:
        return addresses.decode("ascii", "replace")


class _Identity:  # pylint: disable=too-few-public-methods
    """The (st_dev, st_ino) of a maps line, shaped like a stat result for _canonical (never a character device)."""

    st_mode = stat.S_IFREG
    st_rdev = 0  # never read: not a character device

    def __init__(self, dev: int, ino: int) -> None:
        self.st_dev, self.st_ino = dev, ino


def _maps_identity(dev: bytes, inode: bytes) -> Optional[_Identity]:
    """The identity of the file a maps line names ("fd:01", "1234"), when it is one of the known device files."""
    try:
        major, minor = (int(part, 16) for part in dev.split(b":"))
        identity = _Identity(os.makedev(major, minor), int(inode))
    except ValueError:
        return None
    return identity if (identity.st_dev, identity.st_ino) in _known_files() else None


def scan_process(pid: int, proc: str = "/proc") -> Optional[DeviceHandles]:
    """Scan one process; return its DeviceHandles, or None when it holds no NVIDIA device file.

    Reads /proc/PID/fd, the fd tables of its other threads where they differ (a thread can
    run with its own fd table, and a process whose main thread exited has an empty
    /proc/PID/fd while its other threads still hold files), and /proc/PID/maps.
    A process that vanished or cannot be read yields None.
    """
    handles = DeviceHandles(pid)
    base = "%s/%d/" % (proc, pid)
    size_counts_fds = _size_counts_fds(proc)
    leader = _fd_table(base + "fd", size_counts_fds)
    leader_holds = leader is not None and _record_fds(leader[1], handles, base + "fd", leader[0])
    if _maybe_other_threads(base):
        leader_names = leader[0] if leader else []
        leader_set = None
        for tid in _listdir(base + "task") or ():
            if tid == str(pid):
                continue
            task_fd = "%stask/%s/fd" % (base, tid)
            names = _listdir(task_fd)
            # Threads normally share the leader's fd table (CLONE_FILES): an identical
            # set of fd numbers is taken as the same table, to avoid re-reading it per
            # thread. Only a table that differs is read again.
            if not names or names == leader_names:
                continue
            if leader_set is None:
                leader_set = set(leader_names)
            if set(names) == leader_set:
                continue
            table = _fd_table(task_fd, False)
            if table is not None and _record_fds(table[1], handles, task_fd, table[0]) and not leader_holds:
                handles.thread_only = True
    if _scan_maps(proc, pid, handles) and not leader_holds:
        handles.thread_only = True
    if not handles.seen_in:
        return None
    return handles


def scan_holders(
    proc: str = "/proc",
    skip_pids: Iterable[int] = (),
    workers: Optional[int] = None,
    problems: Optional[List[str]] = None,
) -> Dict[int, DeviceHandles]:
    """Every process holding an NVIDIA device file: {pid: DeviceHandles}.

    Args:
        proc: the /proc to read (its PID namespace is the one PIDs refer to).
        skip_pids: PIDs not to scan (for example our own process and its NVML worker).
        workers: processes sharing the scan; None picks one per PIDS_PER_WORKER processes, at most
            one per CPU we may run on and MAX_WORKERS (1 where we are multi-threaded: see _scan_parallel).
        problems: a list that gets one sentence per worker that did not finish (see _scan_parallel).
    """
    skip = set(skip_pids)
    pids = [pid for pid in _proc.list_pids(proc) if pid not in skip]
    if workers is None:
        workers = _worker_count(len(pids))
    if workers > 1:
        return _scan_parallel(pids, proc, workers, problems if problems is not None else [])
    return _scan_pids(pids, proc)


# A scan of many processes is shared by forked workers: reading /proc costs kernel time per fd and
# per mapping, which spreads over CPUs; below a few hundred processes a fork costs more than it saves.
PIDS_PER_WORKER = 250
MAX_WORKERS = 8
# How long a scan worker may take to send its share (seconds), and to be reaped after SIGKILL. A worker reading the
# maps of a process stuck in the driver sleeps uninterruptibly (state D), where SIGKILL waits: it is left behind.
WORKER_REPLY_S = 20.0
KILLED_EXIT_S = 1.0


def _worker_count(pid_count: int) -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS, pid_count // PIDS_PER_WORKER))


def _scan_pids(pids: Iterable[int], proc: str) -> Dict[int, DeviceHandles]:
    holders = {}
    for pid in pids:
        handles = scan_process(pid, proc)
        if handles is not None:
            holders[pid] = handles
    return holders


def _scan_parallel(pids: List[int], proc: str, workers: int, problems: List[str]) -> Dict[int, DeviceHandles]:
    """scan_holders' result for `pids`, read by `workers` processes: this one and forked children.

    Each child scans every workers-th PID and sends its holders as JSON through a pipe. A child that fails (or a
    fork that fails) leaves its share to this process, so the result is the same as a serial scan's. A child that
    sends nothing within WORKER_REPLY_S is killed; its share is not scanned again (what held it would hold this
    process too) and a sentence in `problems` says so, as for a child that SIGKILL does not end in time (left
    behind). A multi-threaded process scans alone: a fork copies only the calling thread, and a lock held by
    another thread would stay locked in the child.
    """
    if not _proc.single_threaded():
        return _scan_pids(pids, proc)
    children = []
    for share in range(1, workers):
        try:
            read_end, write_end = os.pipe()
            child = _proc.fork_worker(
                functools.partial(_send_scan, pids[share::workers], proc, write_end), close=(read_end,)
            )
        except OSError:
            break
        os.close(write_end)
        children.append((share, child, read_end))
    done = len(children) + 1
    holders = _scan_pids(pids[0::workers], proc)
    deadline = time.monotonic() + WORKER_REPLY_S
    for share, child, read_end in children:
        data = _read_until(read_end, deadline)
        status = _reap(child, data is not None)
        if data is None:
            problems.append(
                "a /proc scan worker (PID %d) did not answer within %.0f s (a process stuck in the driver?); "
                "%d processes were not scanned%s"
                % (
                    child,
                    WORKER_REPLY_S,
                    len(pids[share::workers]),
                    "" if status is not None else "; the worker was left behind (not ended by SIGKILL)",
                )
            )
            continue
        try:
            found = json.loads(data.decode("utf-8")) if status in (0, None) else None
        except ValueError:
            found = None
        if found is None:
            holders.update(_scan_pids(pids[share::workers], proc))
            continue
        for entry in found:
            holders[entry["pid"]] = DeviceHandles.from_dict(entry)
    for share in range(done, workers):  # forks that failed: scan their shares here
        holders.update(_scan_pids(pids[share::workers], proc))
    return holders


def _read_until(fd: int, deadline: float) -> Optional[bytes]:
    """Everything from pipe `fd` until its end, or None when `deadline` (monotonic) passes first; `fd` is closed."""
    chunks: List[bytes] = []
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


def _reap(child: int, answered: bool) -> Optional[int]:
    """Reap our worker `child`: its exit status, or None when it is left behind. One that did not answer is
    SIGKILLed first; each wait is bounded (KILLED_EXIT_S after SIGKILL, WORKER_REPLY_S after an answer)."""
    if not answered:
        try:
            os.kill(child, signal.SIGKILL)
        except OSError:
            pass
    deadline = time.monotonic() + (KILLED_EXIT_S if not answered else WORKER_REPLY_S)
    while True:
        pid, status = os.waitpid(child, os.WNOHANG)
        if pid:
            return os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.005)


def _send_scan(pids: List[int], proc: str, write_end: int) -> None:
    """A worker's share of _scan_parallel: scan `pids`, write their holders as JSON to `write_end`."""
    found = _scan_pids(pids, proc)
    with os.fdopen(write_end, "wb") as out:
        out.write(json.dumps([handles.as_dict() for handles in found.values()]).encode("utf-8"))


def proc_driver_minors(proc: str = "/proc") -> List[KernelGpu]:
    """GPUs known to the kernel module, from /proc/driver/nvidia/gpus/*/information.

    Used when the NVML library is missing but the kernel driver is loaded. Returns a list of
    {"pci_bus_id", "minor", "uuid", "name"} sorted by PCI bus id (NVML's default enumeration
    order); [] when the kernel module is not loaded.
    """
    base = os.path.join(proc, "driver", "nvidia", "gpus")
    gpus = []
    for bus in sorted(_listdir(base) or ()):
        # The directory is named 0000:2a:00.0 (nv-procfs.c, lower-case hex); NVML writes 00000000:2A:00.0.
        info: KernelGpu = {"pci_bus_id": bus.rjust(16, "0").upper(), "minor": None, "uuid": None, "name": None}
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


def scan_pids(pids: Iterable[int], proc: str = "/proc") -> Dict[int, DeviceHandles]:
    """scan_holders' result for these PIDs only (those that hold no NVIDIA device file, or are gone, are left out)."""
    return _scan_pids(pids, proc)


# The lines of /proc/driver/nvidia-caps/mig-minors (the numbering itself: _holders.mig_cap).
_MIG_MINOR_RE = re.compile(r"^gpu(?P<gpu>\d+)/gi(?P<gi>\d+)/(?:ci(?P<ci>\d+)/)?access$")


def cap_map(proc: str = "/proc") -> Optional[CapMap]:
    """{cap minor: (GPU minor, GPU instance id, compute instance id or None)} from
    PROC/driver/nvidia-caps/mig-minors (lines "gpu0/gi7/access 66", "gpu0/gi7/ci0/access 67", "config 1");
    None when the file is absent (no MIG-capable driver loaded): _holders.mig_cap numbers them then."""
    try:
        with open(os.path.join(proc, "driver", "nvidia-caps", "mig-minors")) as handle:
            lines = handle.read().splitlines()
    except OSError:
        return None
    caps = {}
    for line in lines:
        fields = line.split()
        if len(fields) != 2 or not fields[1].isdigit():
            continue
        match = _MIG_MINOR_RE.match(fields[0])
        if match:
            ci = match.group("ci")
            caps[int(fields[1])] = (int(match.group("gpu")), int(match.group("gi")), None if ci is None else int(ci))
    return caps
