"""tests/gpu/gpucheck/procs.py: /proc reading against a fake /proc tree, and pinned signalling of real children."""

import os
import signal
import subprocess
import sys

from gpucheck import procs


def fake_process(proc, pid, ppid, comm="python", nspid=None, fds=None, cmdline="python", state="S", start=1000):
    """Write /proc/PID/{stat,status,cmdline,task/PID/fd} for a fake process; fds: {fd: link target}."""
    base = proc / str(pid)
    (base / "task" / str(pid) / "fd").mkdir(parents=True)
    fields = [state, str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 10
    (base / "stat").write_text("%d (%s) %s\n" % (pid, comm, " ".join(fields)))
    (base / "status").write_text("Name:\t%s\nNSpid:\t%s\n" % (comm, "\t".join(str(p) for p in (nspid or [pid]))))
    (base / "cmdline").write_bytes(cmdline.replace(" ", "\0").encode() + b"\0")
    for fd, target in (fds or {}).items():
        os.symlink(target, base / "task" / str(pid) / "fd" / str(fd))


def test_read_stat_handles_comm_with_spaces_and_parentheses(tmp_path):
    fake_process(tmp_path, 42, 7, comm="VLLM::W (x) y", state="D", start=98765)
    assert procs.read_stat(42, str(tmp_path)) == {
        "state": "D",
        "ppid": 7,
        "start_ticks": 98765,
        "comm": "VLLM::W (x) y",
    }
    assert procs.read_stat(43, str(tmp_path)) is None


def test_nested_holder_maps_back_to_its_host_pid(tmp_path):
    fake_process(tmp_path, 100, 1, comm="unshare")
    fake_process(tmp_path, 101, 100, comm="sh", nspid=[101, 1])
    fake_process(tmp_path, 102, 101, comm="python", nspid=[102, 2])
    fake_process(tmp_path, 200, 1, comm="python", nspid=[200, 2])  # another namespace's PID 2, not ours
    assert procs.descendants(100, str(tmp_path)) == [101, 102]
    assert procs.nspids(102, str(tmp_path)) == [102, 2]
    assert procs.host_pid(2, 100, str(tmp_path)) == 102
    assert procs.host_pid(3, 100, str(tmp_path)) is None


def test_device_files_are_read_from_every_thread(tmp_path):
    fake_process(tmp_path, 50, 1, fds={3: "/dev/nvidiactl", 4: "/dev/nvidia0", 5: "/dev/nvidia0", 6: "/tmp/log"})
    thread = tmp_path / "50" / "task" / "51" / "fd"
    thread.mkdir(parents=True)
    os.symlink("/dev/nvidia-uvm", thread / "9")
    assert procs.device_files(50, str(tmp_path)) == ["/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"]
    assert procs.device_files(51, str(tmp_path)) == []


def test_device_mappings_are_the_maps_lines_of_nvidia_files(tmp_path):
    fake_process(tmp_path, 60, 1)
    (tmp_path / "60" / "maps").write_text(
        "55d0c0000000-55d0c0001000 r--p 00000000 08:01 131 /usr/bin/python3.12\n"
        "7f3a00000000-7f3a00200000 rw-s 00000000 00:05 1043 /dev/nvidiactl\n"
        "7f3a00200000-7f3a00400000 rw-s 00000000 00:05 1050 /dev/nvidia0\n"
        "7f3a00400000-7f3a00600000 rw-s 00002000 00:05 1050 /dev/nvidia0\n"
        "7f3a00600000-7f3a00800000 rw-s 00000000 00:05 1060 /dev/nvidia-uvm (deleted)\n"
        "7f3a00800000-7f3a00a00000 rw-p 00000000 00:00 0 \n"
        "7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n"
    )
    lines = procs.device_mappings(60, str(tmp_path))
    assert lines == [
        "7f3a00000000-7f3a00200000 rw-s 00000000 00:05 1043 /dev/nvidiactl",
        "7f3a00200000-7f3a00400000 rw-s 00000000 00:05 1050 /dev/nvidia0",
        "7f3a00400000-7f3a00600000 rw-s 00002000 00:05 1050 /dev/nvidia0",
        "7f3a00600000-7f3a00800000 rw-s 00000000 00:05 1060 /dev/nvidia-uvm (deleted)",
    ]
    assert procs.mapped_paths(lines) == ["/dev/nvidia-uvm (deleted)", "/dev/nvidia0", "/dev/nvidiactl"]
    assert procs.device_mappings(61, str(tmp_path)) == []  # gone
    own = procs.device_mappings(os.getpid())  # the real /proc: this test process maps no NVIDIA file
    assert own == []


def test_processes_with_marker(tmp_path):
    fake_process(tmp_path, 10, 1, cmdline="python workload.py --marker gpucheck-1-ab")
    fake_process(tmp_path, 11, 1, cmdline="VLLM::Worker_TP0 [gpucheck-1-ab]")
    fake_process(tmp_path, 12, 1, cmdline="python workload.py --marker gpucheck-2-cd")
    assert procs.processes_with("gpucheck-1-ab", str(tmp_path)) == [10, 11]


def sleeper():
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_pinned_kills_its_process_once():
    child = sleeper()
    try:
        pinned = procs.Pinned(child.pid, popen=child)
        assert pinned.alive()
        assert pinned.kill(signal.SIGKILL)
        child.wait(timeout=10)
        assert not pinned.alive()
        assert not pinned.kill(signal.SIGKILL)  # reaped: nothing left to signal
        pinned.close()
    finally:
        child.kill()
        child.wait()


def test_pinned_never_signals_a_pid_with_another_start_time():
    child = sleeper()
    try:
        pinned = procs.Pinned(child.pid)
        pinned.close()  # no pidfd: the start time is all that guards the PID
        pinned.start_ticks += 1  # as if the PID now named another process
        assert not pinned.alive()
        assert not pinned.kill(signal.SIGKILL)
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_device_fd_counts_and_record(tmp_path):
    fake_process(tmp_path, 70, 1)
    fd_dir = tmp_path / "70" / "fd"
    fd_dir.mkdir()
    for fd, target in {
        3: "/dev/nvidiactl",
        4: "/dev/nvidia0",
        5: "/dev/nvidia0",
        6: "/tmp/log",
        7: "/dev/nvidia-uvm",
    }.items():
        os.symlink(target, fd_dir / str(fd))
    (tmp_path / "70" / "maps").write_text("7f00-7f20 rw-s 00000000 00:06 142 /dev/nvidia0\n")
    assert procs.device_fd_counts(70, str(tmp_path)) == {"/dev/nvidia-uvm": 1, "/dev/nvidia0": 2, "/dev/nvidiactl": 1}
    assert procs.device_record(70, str(tmp_path)) == {
        "pid": 70,
        "fds": {"/dev/nvidia-uvm": 1, "/dev/nvidia0": 2, "/dev/nvidiactl": 1},
        "maps": ["7f00-7f20 rw-s 00000000 00:06 142 /dev/nvidia0"],
    }
    assert procs.device_fd_counts(71, str(tmp_path)) == {}


def test_maps_fields_and_file_identity(tmp_path):
    assert procs.maps_fields("200600000-200800000 rw-s 00000000 00:06 142 /dev/nvidia0") == (
        "rw-s",
        (0, 6),
        142,
        "/dev/nvidia0",
    )
    assert procs.maps_fields("7f3a00800000-7f3a00a00000 rw-p 00000000 00:00 0") is None
    assert procs.maps_fields("7f00-7f20 rw-s 00000000 fd:1a 9 /dev/nvidia3") == (
        "rw-s",
        (0xFD, 0x1A),
        9,
        "/dev/nvidia3",
    )
    path = tmp_path / "nvidia3"
    path.write_bytes(b"")
    status = os.stat(path)
    assert procs.file_identity(str(path)) == ((os.major(status.st_dev), os.minor(status.st_dev)), status.st_ino)
    assert procs.file_identity(str(tmp_path / "absent")) is None


def test_argv0_environ_all_pids_and_available_memory(tmp_path):
    fake_process(tmp_path, 80, 1, cmdline="/usr/local/nvidia/bin/nvidia-cuda-mps-server")
    (tmp_path / "80" / "environ").write_bytes(b"A=1\0CUDA_MPS_PIPE_DIRECTORY=/tmp/x\0")
    fake_process(tmp_path, 9, 1)
    (tmp_path / "self").mkdir()
    assert procs.argv0(80, str(tmp_path)) == "nvidia-cuda-mps-server" and procs.argv0(81, str(tmp_path)) is None
    assert b"CUDA_MPS_PIPE_DIRECTORY=/tmp/x" in procs.environ(80, str(tmp_path))
    assert procs.environ(81, str(tmp_path)) == b""
    assert procs.all_pids(str(tmp_path)) == [9, 80]
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:   120000000 kB\n")
    assert procs.mem_available_bytes(str(meminfo)) == 120000000 * 1024
    assert procs.mem_available_bytes(str(tmp_path / "none")) is None
