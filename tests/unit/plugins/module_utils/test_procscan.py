# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_procscan, and the /proc readers of _proc, against a fake /proc tree built in tmp_path (symlinks only point at /dev
paths; nothing is created in /dev)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _proc, _procscan

# A /proc/PID/stat whose comm holds spaces and ") ": field 22 (starttime) is 987654, every other number differs.
STAT_TRICKY = (
    b"4242 (VLLM::Worker) 1 x) S 1 4100 4100 0 -1 4194560 11 12 13 14 15 16 17 18 20 0 "
    b"41 0 987654 123456789 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n"
)

INFORMATION_H100 = """Model: \t\t NVIDIA H100 80GB HBM3
IRQ:   \t\t 2147
GPU UUID: \t GPU-5a3e1c2b-1111-4000-8000-000000000000
Video BIOS: \t 96.00.74.00.01
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t 0000:18:00.0
Device Minor: \t 2
GPU Firmware: \t 535.129.03
GPU Excluded:\t No
"""


def make_process(proc, pid, fds=None, tasks=None, maps=b"", stat=None, status=None, task_maps=None):
    """Create proc/PID with fd/ links ({fd: target}), task/TID/fd/ ({tid: {fd: target}}), maps, stat, status, and
    task/TID/maps ({tid: bytes}).

    The leader's task entry gets the leader's fds unless `tasks` names it.
    """
    base = proc / str(pid)
    (base / "fd").mkdir(parents=True)
    for fd, target in (fds or {}).items():
        os.symlink(target, str(base / "fd" / str(fd)))
    tasks = dict(tasks or {})
    tasks.setdefault(pid, fds or {})
    for tid, task_fds in tasks.items():
        (base / "task" / str(tid) / "fd").mkdir(parents=True)
        for fd, target in task_fds.items():
            os.symlink(target, str(base / "task" / str(tid) / "fd" / str(fd)))
    (base / "maps").write_bytes(maps)
    for tid, data in (task_maps or {}).items():
        (base / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
        (base / "task" / str(tid) / "maps").write_bytes(data)
    if stat is not None:
        (base / "stat").write_bytes(stat)
    if status is not None:
        (base / "status").write_text(status)
    return base


@pytest.fixture
def proc(tmp_path):
    root = tmp_path / "proc"
    root.mkdir()
    (root / "self").mkdir()  # non-numeric entries are not processes
    return root


def test_fd_and_mapping_give_minors_control_and_seen_in(proc):
    maps = (
        b"55d0c0000000-55d0c0001000 r--p 00000000 08:01 131 /usr/bin/python3.12\n"
        b"7f3a40000000-7f3a40200000 rw-s 00200000 00:05 1027                       /dev/nvidia2\n"
    )
    make_process(
        proc,
        100,
        fds={0: "/dev/null", 1: "socket:[4711]", 3: "/dev/nvidia3", 4: "/dev/nvidiactl", 5: "anon_inode:[eventfd]"},
        maps=maps,
    )
    handles = _procscan.scan_process(100, str(proc))
    assert handles.as_dict() == {
        "pid": 100,
        "minors": [2, 3],
        "mapped": [2],
        "contexts": [2],
        "ctl": True,
        "ctl_rw": False,
        "uvm": False,
        "control": True,
        "seen_in": ["fd", "mapping"],
        "thread_only": False,
        "caps": [],
    }
    assert handles.cuda is True  # a device mapping is CUDA's, NVML never maps a device


# What real processes open and map on an H200 with driver 580.159.04 (tests/fixtures/hardware/README.md, point 2):
# an NVML client opens nvidia-uvm twice and maps nothing; nvidia-smi maps nvidiactl read-only; a process that only
# initialized CUDA maps its GPU's file write-only (the doorbells) and nvidiactl read-only; a context maps its GPU's file
# rw-s at offset 0 and nvidiactl rw-s many times.
NVML_FDS = {3: "/dev/nvidiactl", 4: "/dev/nvidia0", 5: "/dev/nvidia1", 6: "/dev/nvidia-uvm", 7: "/dev/nvidia-uvm"}
NVML_FDS.update({8: "/dev/nvidia-caps/nvidia-cap1", 9: "/dev/nvidia-caps/nvidia-cap2"})
SMI_MAPS = b"7f0000001000-7f0000002000 r--s 00000000 00:06 141 /dev/nvidiactl\n"
CUINIT_MAPS = (
    b"7f0000010000-7f0000020000 -w-s 00000000 00:06 142 /dev/nvidia0\n"
    b"7f0000020000-7f0000030000 -w-s 00000000 00:06 142 /dev/nvidia0\n"
) + SMI_MAPS
CONTEXT_MAPS = (
    b"200600000-200800000 rw-s 00000000 00:06 142                              /dev/nvidia0\n"
    b"200800000-204000000 rw-s 00000000 00:06 141                              /dev/nvidiactl\n"
    b"204a00000-204c00000 rw-s 204a00000 00:06 143                             /dev/nvidia-uvm\n"
) + CUINIT_MAPS


def test_nvml_clients_cuda_initialized_processes_and_contexts_are_told_apart(proc):
    make_process(proc, 100, fds=NVML_FDS)
    make_process(proc, 101, fds=NVML_FDS, maps=SMI_MAPS)
    make_process(proc, 102, fds={3: "/dev/nvidiactl", 4: "/dev/nvidia-uvm", 5: "/dev/nvidia0"}, maps=CUINIT_MAPS)
    make_process(proc, 103, fds=NVML_FDS, maps=CONTEXT_MAPS)
    nvml, smi, cuinit, context = (_procscan.scan_process(pid, str(proc)) for pid in (100, 101, 102, 103))
    assert [(h.uvm, h.cuda, sorted(h.contexts), h.ctl_rw) for h in (nvml, smi, cuinit, context)] == [
        (True, False, [], False),
        (True, False, [], False),
        (True, True, [], False),
        (True, True, [0], True),
    ]
    assert [h.context_on(0) for h in (nvml, smi, cuinit, context)] == [False, False, False, True]
    assert not context.context_on(1)
    assert _procscan.DeviceHandles.from_dict(context.as_dict()).as_dict() == context.as_dict()
    assert sorted(_procscan.scan_pids([100, 101, 999], str(proc))) == [100, 101]


def test_zero_framebuffer_context_is_an_rw_nvidiactl_mapping_beside_the_gpus_file(proc):
    """A GB10 has no framebuffer: a context's memory is system memory, mapped through nvidiactl (open-gpu-kernel-modules
    osapi.c RmCreateMmapContextLocked). Decided from the source, not measured."""
    ctl_rw = b"7f0000100000-7f0000300000 rw-s 00000000 00:06 141 /dev/nvidiactl\n"
    make_process(proc, 110, fds={3: "/dev/nvidiactl", 4: "/dev/nvidia0"}, maps=ctl_rw + CUINIT_MAPS)
    make_process(proc, 111, fds={3: "/dev/nvidiactl", 4: "/dev/nvidia0"}, maps=CUINIT_MAPS)
    gb10, cuinit = _procscan.scan_process(110, str(proc)), _procscan.scan_process(111, str(proc))
    assert (gb10.context_on(0, zero_fb=True), gb10.context_on(0)) == (True, False)
    assert cuinit.context_on(0, zero_fb=True) is False


def test_scan_ignores_fd_positions_and_mapping_offsets(tmp_path):
    """The simulator says which process created a context by fd position; the collection must not read it, nor
    mapping offsets: the same process with other positions and offsets scans the same."""
    results = []
    for variant, (position, offset) in enumerate(((0, b"00000000"), (4242, b"00200000"))):
        proc = tmp_path / ("proc%d" % variant)
        base = make_process(proc, 120, fds=NVML_FDS, maps=CONTEXT_MAPS.replace(b"rw-s 00000000", b"rw-s " + offset))
        (base / "fdinfo").mkdir()
        for fd in NVML_FDS:
            (base / "fdinfo" / str(fd)).write_text("pos:\t%d\nflags:\t02100002\nmnt_id:\t24\n" % position)
        results.append(_procscan.scan_process(120, str(proc)).as_dict())
    assert results[0] == results[1] and results[0]["contexts"] == [0]


def test_control_devices_alone_set_control_without_minors(proc):
    make_process(proc, 110, fds={3: "/dev/nvidia-uvm", 4: "/dev/nvidia-uvm-tools", 5: "/dev/nvidia-caps/nvidia-cap1"})
    handles = _procscan.scan_process(110, str(proc))
    assert handles.control is True
    assert handles.minors == set()
    assert handles.seen_in == {"fd"}


def test_mapping_only_holder(proc):
    make_process(
        proc, 120, fds={0: "/dev/null"}, maps=b"7f3a40000000-7f3a40200000 rw-s 00000000 00:05 1027 /dev/nvidia7\n"
    )
    handles = _procscan.scan_process(120, str(proc))
    assert handles.minors == {7}
    assert handles.seen_in == {"mapping"}


def test_lookalike_paths_are_not_devices(proc):
    make_process(
        proc,
        130,
        fds={3: "/dev/nvidia3x", 4: "/dev/nvidia-smi.log", 5: "/tmp/dev/nvidia0"},
        maps=b"7f00-7f01 r--p 00000000 08:01 9 /dev/nvidia-foo\n",
    )
    assert _procscan.scan_process(130, str(proc)) is None


def test_thread_only_holder_with_empty_leader_fd_dir(proc):
    # The main thread exited: /proc/PID/fd is empty, another thread still has the device open.
    make_process(proc, 200, fds={}, tasks={200: {}, 201: {5: "/dev/nvidia0", 6: "/dev/nvidiactl"}})
    handles = _procscan.scan_process(200, str(proc))
    assert handles.minors == {0}
    assert handles.thread_only is True
    assert handles.seen_in == {"fd"}


CONTEXT_MAPS = (
    b"200600000-200800000 rw-s 00000000 00:05 1027 /dev/nvidia0\n"
    b"7f3a40000000-7f3a40001000 rw-s 00000000 00:05 1030 /dev/nvidiactl\n"
)


def test_a_zombie_leaders_context_is_read_from_a_live_threads_mappings(proc):
    """The main thread exited while another thread keeps the context: /proc/PID/maps of the zombie leader is empty
    (its mm is gone), /proc/PID/task/TID/maps of the live thread shows the address space (issue 40, item 9)."""
    make_process(
        proc,
        210,
        fds={},
        tasks={210: {}, 211: {5: "/dev/nvidia0", 6: "/dev/nvidiactl"}},
        maps=b"",
        task_maps={210: b"", 211: CONTEXT_MAPS},
    )
    handles = _procscan.scan_process(210, str(proc))
    assert handles.contexts == {0} and handles.mapped == {0} and handles.ctl_rw
    assert handles.thread_only is True and handles.seen_in == {"fd", "mapping"}


def test_threads_maps_are_not_read_where_the_leaders_are(proc, monkeypatch):
    """Bounded: a live leader's maps are the address space every thread shares; the threads' are never read."""
    make_process(proc, 220, fds={3: "/dev/nvidia0"}, maps=CONTEXT_MAPS, tasks={221: {3: "/dev/nvidia0"}})
    # Never so on a real host; here it tells whether the scan read it.
    (proc / "220" / "task" / "221" / "maps").write_bytes(b"7f00-7f20 rw-s 00000000 00:05 1028 /dev/nvidia1\n")
    handles = _procscan.scan_process(220, str(proc))
    assert handles.contexts == {0} and handles.thread_only is False


def test_thread_with_its_own_fd_table_is_read(proc):
    # The leader's table holds no NVIDIA file; thread 301 runs with its own fd table that does.
    make_process(proc, 300, fds={0: "/dev/null", 1: "pipe:[99]"}, tasks={301: {0: "/dev/null", 7: "/dev/nvidia1"}})
    handles = _procscan.scan_process(300, str(proc))
    assert handles.minors == {1}
    assert handles.thread_only is True


def test_thread_sharing_the_leaders_device_is_not_thread_only(proc):
    make_process(proc, 310, fds={3: "/dev/nvidia4"}, tasks={311: {3: "/dev/nvidia4", 8: "/dev/nvidia5"}})
    handles = _procscan.scan_process(310, str(proc))
    assert handles.minors == {4, 5}
    assert handles.thread_only is False


def test_scan_holders_skips_non_holders_vanished_entries_and_skip_pids(proc):
    make_process(proc, 100, fds={3: "/dev/nvidia3"})
    make_process(proc, 400, fds={0: "/dev/null"})  # holds nothing
    (proc / "500").mkdir()  # vanished: no fd, task or maps left
    base = make_process(proc, 600, fds={3: "/dev/nvidia0"})
    (base / "fd" / "9").write_text("")  # not a link (readlink EINVAL): skipped like a vanished fd
    make_process(proc, 700, fds={3: "/dev/nvidia1"})
    holders = _procscan.scan_holders(str(proc), skip_pids=[700])
    assert sorted(holders) == [100, 600]
    assert holders[600].minors == {0}
    assert sorted(_proc.list_pids(str(proc))) == [100, 400, 500, 600, 700]


def test_read_start_ticks_takes_field_22_after_a_comm_with_parenthesis(proc):
    make_process(proc, 4242, stat=STAT_TRICKY)
    assert _proc.read_start_ticks(4242, str(proc)) == 987654
    assert _proc.read_start_ticks(4243, str(proc)) is None


def test_read_start_ticks_of_a_real_process_is_stable():
    ticks = _proc.read_start_ticks(os.getpid())
    assert isinstance(ticks, int) and ticks > 0
    assert _proc.read_start_ticks(os.getpid()) == ticks


def test_read_nspids(proc):
    make_process(proc, 4242, status="Name:\tpython3\nTgid:\t4242\nNSpid:\t4242\t17\t1\nPPid:\t1\n")
    make_process(proc, 4300, status="Name:\told-kernel\nPid:\t4300\n")
    assert _proc.read_nspids(4242, str(proc)) == [4242, 17, 1]
    assert _proc.read_nspids(4300, str(proc)) == [4300]
    assert _proc.read_nspids(4999, str(proc)) == []


def test_proc_driver_minors_reads_information_files_in_bus_order(proc):
    gpus_dir = proc / "driver" / "nvidia" / "gpus"
    (gpus_dir / "0000:18:00.0").mkdir(parents=True)
    (gpus_dir / "0000:18:00.0" / "information").write_text(INFORMATION_H100)
    (gpus_dir / "0000:2a:00.0").mkdir()
    (gpus_dir / "0000:2a:00.0" / "information").write_text(
        INFORMATION_H100.replace("GPU-5a3e1c2b-1111", "GPU-5a3e1c2b-2222")
        .replace("Device Minor: \t 2", "Device Minor: \t 0")
        .replace("0000:18:00.0", "0000:2a:00.0")
    )
    (gpus_dir / "0000:05:00.0").mkdir()  # no information file: skipped
    (gpus_dir / "0000:06:00.0").mkdir()
    (gpus_dir / "0000:06:00.0" / "information").write_text("Model: \t\t NVIDIA H100\nDevice Minor: \t garbage\n")
    assert _procscan.proc_driver_minors(str(proc)) == [
        {
            "pci_bus_id": "00000000:18:00.0",
            "minor": 2,
            "uuid": "GPU-5a3e1c2b-1111-4000-8000-000000000000",
            "name": "NVIDIA H100 80GB HBM3",
        },
        {
            "pci_bus_id": "00000000:2A:00.0",
            "minor": 0,
            "uuid": "GPU-5a3e1c2b-2222-4000-8000-000000000000",
            "name": "NVIDIA H100 80GB HBM3",
        },
    ]


def test_proc_driver_minors_without_kernel_module(proc):
    assert _procscan.proc_driver_minors(str(proc)) == []


def test_scan_split_over_worker_processes_equals_the_serial_scan(proc):
    maps = b"7f3a40000000-7f3a40200000 rw-s 00000000 00:05 1027 /dev/nvidia5\n"
    for pid in range(100, 130):
        kind = pid % 4
        make_process(
            proc,
            pid,
            fds={0: "/dev/null", 3: "/dev/nvidia%d" % (pid % 8)} if kind == 0 else {0: "/dev/null"},
            tasks={pid + 1000: {7: "/dev/nvidiactl"}} if kind == 1 else None,
            maps=maps if kind == 2 else b"",
        )
    serial = _procscan.scan_holders(str(proc), skip_pids=[104], workers=1)
    parallel = _procscan.scan_holders(str(proc), skip_pids=[104], workers=3)
    assert sorted(parallel) == sorted(serial) and len(serial) == 22
    assert [parallel[pid].as_dict() for pid in sorted(parallel)] == [serial[pid].as_dict() for pid in sorted(serial)]
    assert parallel[101].thread_only is True and parallel[101].control is True
    assert parallel[102].seen_in == {"mapping"} and parallel[102].minors == {5}


# A process with fds 0, 1, 2 (stdio) and the numbers in argv[1:] open on /dev/zero; says "ready", then sleeps.
_SPARSE_FDS = (
    "import os, sys, time\n"
    "for number in sys.argv[1:]:\n"
    "    os.dup2(os.open('/dev/zero', os.O_RDONLY), int(number))\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.mark.parametrize(
    "numbers, found_by_number",
    [
        ((5, 9), True),  # holes a few numbers wide: read by number
        ((5, 9, 300), False),  # fd 300 is past 2 * count + 64 numbers: the directory is listed instead
    ],
)
def test_fds_read_by_number_match_the_listing_of_a_sparse_table(numbers, found_by_number):
    child = subprocess.Popen(
        [sys.executable, "-c", _SPARSE_FDS] + [str(number) for number in numbers],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert child.stdout.readline() == "ready\n"
        fd_dir = "/proc/%d/fd" % child.pid
        listed = dict(zip(*_procscan._fd_table(fd_dir, size_counts_fds=False)))
        # Each os.open above took the lowest free number before dup2 moved it: the child keeps those too.
        assert set(int(name) for name in listed) >= {0, 1, 2} | set(numbers)
        assert listed[str(numbers[-1])] == "/dev/zero"
        if not _procscan._size_counts_fds("/proc"):
            pytest.skip("st_size of /proc/PID/fd is not the number of fds here (Linux < 6.2)")
        assert dict(zip(*_procscan._fd_table(fd_dir, size_counts_fds=True))) == listed
        dir_fd = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            probed = _procscan._probe_fds(dir_fd, len(listed))
        finally:
            os.close(dir_fd)
        assert (probed is not None) == found_by_number
        if found_by_number:
            assert dict(zip(*probed)) == listed
    finally:
        child.kill()
        child.wait()
        child.stdout.close()


def test_fd_directory_sizes_are_not_taken_for_fd_counts_outside_procfs(proc):
    assert _procscan._size_counts_fds(str(proc)) is False


def test_a_failing_scan_worker_leaves_its_share_to_the_caller(proc, monkeypatch):
    for pid in range(100, 112):
        make_process(proc, pid, fds={3: "/dev/nvidia%d" % (pid % 4)})
    caller = os.getpid()
    scan_process = _procscan.scan_process
    scanned_by_caller = []

    def failing_in_workers(pid, proc_dir):
        if os.getpid() != caller:
            raise RuntimeError("worker trouble")
        scanned_by_caller.append(pid)
        return scan_process(pid, proc_dir)

    monkeypatch.setattr(_procscan, "scan_process", failing_in_workers)
    holders = _procscan.scan_holders(str(proc), workers=3)
    assert sorted(holders) == list(range(100, 112))
    assert holders[105].minors == {1}
    # The caller scanned its own third, then the two thirds of the failed workers: every PID once.
    assert sorted(scanned_by_caller) == list(range(100, 112))


def test_device_files_are_known_by_identity_wherever_they_are_mounted(tmp_path, monkeypatch):
    """A file that is /dev/nvidia3 (same device and inode: a bind mount, here a hard link) under another path is
    /dev/nvidia3, by fd and by mapping; nvidia-uvm is known by name; a look-alike named nvidia0 is no device."""
    import mmap

    real = tmp_path / "dev-nvidia3"
    real.write_bytes(b"\0" * 4096)
    bound = tmp_path / "run" / "nvidia" / "driver" / "dev" / "nvidia3"
    bound.parent.mkdir(parents=True)
    os.link(real, bound)
    (tmp_path / "run" / "nvidia" / "driver" / "dev" / "nvidia-uvm").touch()
    (tmp_path / "nvidia0").touch()
    info = os.stat(real)
    monkeypatch.setitem(_procscan._KNOWN, "/dev", {(info.st_dev, info.st_ino): "/dev/nvidia3"})
    fds = [
        os.open(str(bound), os.O_RDWR),
        os.open(str(bound.parent / "nvidia-uvm"), os.O_RDONLY),
        os.open(str(tmp_path / "nvidia0"), os.O_RDONLY),
    ]
    try:
        handles = _procscan.scan_process(os.getpid())
        assert handles.minors == {3} and handles.uvm and handles.mapped == set() and handles.seen_in == {"fd"}
        os.close(fds.pop(0))
        with open(str(bound), "r+b") as mapped_file:
            mapping = mmap.mmap(mapped_file.fileno(), 4096)
        try:
            handles = _procscan.scan_process(os.getpid())
            assert handles.mapped == {3} and handles.minors == {3} and "mapping" in handles.seen_in
        finally:
            mapping.close()
    finally:
        for fd in fds:
            os.close(fd)


def test_character_device_of_major_195_is_an_nvidia_device_by_its_numbers():
    """The kernel's numbers name the device: 195:N is /dev/nvidiaN, 195:255 nvidiactl (no such node exists here)."""

    class Info:  # pylint: disable=too-few-public-methods
        st_mode = 0o20666
        st_dev = st_ino = 0

        def __init__(self, minor):
            self.st_rdev = os.makedev(195, minor)

    assert _procscan._canonical("/run/nvidia/driver/dev/nvidia2", Info(2)) == "/dev/nvidia2"
    assert _procscan._canonical("/somewhere/nvidiactl", Info(255)) == "/dev/nvidiactl"
    assert _procscan._canonical("/somewhere/nvidia-caps/nvidia-cap66", None) == "/dev/nvidia-caps/nvidia-cap66"
    assert _procscan._canonical("/home/me/nvidia-notes", None) is None


class CharDevice:  # pylint: disable=too-few-public-methods
    """A stat result of a character device major:minor (an NVIDIA node is 195:N; no such node is made here)."""

    st_mode = 0o20666
    st_dev = 5
    st_ino = 99999  # an inode no /dev file has: the node was unlinked and made again

    def __init__(self, major, minor):
        self.st_rdev = os.makedev(major, minor)


def unlinked_holder(proc, pid):
    """A context holder whose /dev/nvidia0 and /dev/nvidia-uvm were unlinked and made again while it ran: its fd links
    and maps lines name "/dev/nvidia0 (deleted)", as the kernel writes them (d_path); map_files has each mapping."""
    maps = (
        b"200600000-200800000 rw-s 00000000 00:05 1027 /dev/nvidia0 (deleted)\n"
        b"7f3a40000000-7f3a40001000 rw-s 00000000 00:05 1030 /dev/nvidiactl\n"
        b"7f3a50000000-7f3a50200000 rw-s 7f3a50000000 00:05 1031 /dev/nvidia-uvm (deleted)\n"
    )
    fds = {3: "/dev/nvidiactl", 4: "/dev/nvidia0 (deleted)", 5: "/dev/nvidia-uvm (deleted)", 6: "/dev/nvidia7x"}
    base = make_process(proc, pid, fds=fds, maps=maps)
    (base / "map_files").mkdir()
    os.symlink("/dev/nvidia0 (deleted)", str(base / "map_files" / "200600000-200800000"))
    return base


def test_an_unlinked_device_file_is_known_by_its_character_device_number(proc, monkeypatch):
    """/dev/nvidia0 unlinked and made again while a holder runs (nvidia-modprobe recreates nodes): its fd and its
    mapping still name the old file, "/dev/nvidia0 (deleted)", whose path and inode match nothing. The fd's stat
    (/proc/PID/fd/N) and the mapping's (/proc/PID/map_files/START-END) follow it to the character device, 195:0
    (issue 40, item 12). A real unlinked node cannot be made here (no NVIDIA device, nothing in /dev): the stat of
    those two links is what the test gives."""
    base = unlinked_holder(proc, 230)
    devices = {
        str(base / "fd" / "4"): CharDevice(195, 0),
        str(base / "map_files" / "200600000-200800000"): CharDevice(195, 0),
    }
    monkeypatch.setattr(_procscan, "_stat", devices.get)
    handles = _procscan.scan_process(230, str(proc))
    assert handles.minors == {0} and handles.contexts == {0} and handles.mapped == {0}
    assert handles.uvm and handles.ctl_rw and handles.seen_in == {"fd", "mapping"}


def test_an_unlinked_file_that_is_no_nvidia_device_is_none(proc, monkeypatch):
    """The same lines where the stat says another device (or nothing): not an NVIDIA device file, by its numbers."""
    base = unlinked_holder(proc, 240)
    devices = {str(base / "fd" / "4"): CharDevice(1, 3), str(base / "map_files" / "200600000-200800000"): None}
    monkeypatch.setattr(_procscan, "_stat", devices.get)
    handles = _procscan.scan_process(240, str(proc))
    assert handles.minors == set() and handles.contexts == set() and handles.uvm and handles.ctl


def test_parallel_scan_leaves_behind_a_worker_that_cannot_be_reaped(monkeypatch):
    """A worker reading the maps of a process stuck in the driver sleeps in state D, where SIGKILL waits. Modelled by a
    worker that never answers and a SIGKILL that does not arrive: the scan returns within its bounds, scans the other
    shares, and says which processes it could not scan and that the worker was left behind."""
    import time

    stuck = []

    def never_answers(pids, proc, write_end):
        time.sleep(60)

    monkeypatch.setattr(_procscan, "_send_scan", never_answers)
    monkeypatch.setattr(_procscan, "WORKER_REPLY_S", 0.3)
    monkeypatch.setattr(_procscan, "KILLED_EXIT_S", 0.2)
    monkeypatch.setattr(_proc, "single_threaded", lambda: True)
    real_kill = os.kill
    monkeypatch.setattr(os, "kill", lambda pid, sig: stuck.append(pid))
    problems = []
    pids = [os.getpid(), 1]
    started = time.monotonic()
    try:
        found = _procscan._scan_parallel(pids, "/proc", 2, problems)
        assert time.monotonic() - started < 1.5
    finally:
        for pid in stuck:
            real_kill(pid, 9)
            os.waitpid(pid, 0)
    assert len(stuck) == 1 and set(found) <= {os.getpid()}
    (problem,) = problems
    assert "did not answer within" in problem
    assert "1 processes were not scanned" in problem and "left behind" in problem


def test_parallel_scan_worker_with_a_python_error_leaves_its_share_to_the_caller(monkeypatch):
    def fails(pids, proc, write_end):
        raise RuntimeError("a defect in the worker")

    monkeypatch.setattr(_procscan, "_send_scan", fails)
    monkeypatch.setattr(_proc, "single_threaded", lambda: True)
    problems = []
    serial = _procscan._scan_pids([os.getpid()], "/proc")
    assert _procscan._scan_parallel([1, os.getpid()], "/proc", 2, problems).keys() == serial.keys()
    assert problems == []
