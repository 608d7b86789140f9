# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_gpus: libraries, the index/minor map, process details, Inspector's driver handling and its scan scopes.

Selection and protection are tested in test_select.py. Snapshots here run against child processes started by
the tests (never signalled by this file), with NVML and the /proc scan replaced where a GPU is needed.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
import time
import types

import psutil
import pynvml
import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus, _holders, _proc, _procscan
from polling import wait_for

NO_SUCH_PID = 5000001  # above the largest pid_max (2^22): never a process


def test_check_libraries_names_the_package_host_and_interpreter(monkeypatch):
    monkeypatch.setattr(_gpus, "PSUTIL_IMPORT_ERROR", "Traceback: No module named 'psutil'")
    failures = []
    module = types.SimpleNamespace(fail_json=lambda **kw: failures.append(kw))
    _gpus.check_libraries(module, lambda package: "Failed to import the required Python library (%s)" % package)
    (failure,) = failures
    assert "(psutil)" in failure["msg"] and sys.executable in failure["msg"]
    assert failure["exception"] == "Traceback: No module named 'psutil'"


def test_missing_libraries(monkeypatch):
    assert _gpus.missing_libraries() == []  # both are installed in the test environment
    monkeypatch.setattr(_gpus, "PYNVML_IMPORT_ERROR", "no pynvml")
    monkeypatch.setattr(_gpus, "PSUTIL_IMPORT_ERROR", "no psutil")
    assert _gpus.missing_libraries() == [("nvidia-ml-py", "no pynvml"), ("psutil", "no psutil")]


def test_selection_args_and_default_tolerance():
    assert _gpus.SELECTION_ARGS == {
        "gpus": {"type": "list", "elements": "raw"},
        "driver_timeout": {"type": "float", "default": 10.0},
    }
    assert _gpus.DEFAULT_TOLERANCE_MIB == 256


# --- minor_map ---------------------------------------------------------------------------------------------------


def nvml_gpu(index, used_mib=3, processes=(), minor=None, error=None):
    """One GPU as _nvml.read_gpu returns it; processes: [(pid, MiB, type)]."""
    return {
        "index": index,
        "minor": index if minor is None else minor,
        "uuid": "GPU-%d" % index,
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:%02X:00.0" % (0x18 + index),
        "memory": None
        if used_mib is None
        else {
            "total_mib": 81559,
            "used_mib": used_mib,
            "free_mib": 81559 - 529 - used_mib,
            "reserved_mib": 529,
            "source": "v2",
        },
        "processes": [{"pid": pid, "used_mib": mib, "type": kind} for pid, mib, kind in processes],
        "error": error,
    }


def driver(*gpus, version="580.95.05"):
    return {
        "available": True,
        "error": None,
        "driver_version": version,
        "nvml_version": "13.580.95.05",
        "cuda_driver_version": 13000,
        "gpus": list(gpus),
    }


NO_DRIVER = {
    "available": False,
    "error": "NVMLError_LibraryNotFound: NVML Shared Library Not Found",
    "gpus": [],
    "driver_version": None,
    "nvml_version": None,
    "cuda_driver_version": None,
}


def test_minor_map_from_nvml():
    table, source = _gpus.minor_map(driver(nvml_gpu(0, minor=3), nvml_gpu(1, minor=0)), "/nonexistent")
    assert source == "nvml"
    assert table == [
        {"index": 0, "minor": 3, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:18:00.0"},
        {"index": 1, "minor": 0, "uuid": "GPU-1", "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:19:00.0"},
    ]


def test_minor_map_from_proc_driver_in_bus_order(tmp_path):
    for bus, minor in (("0000:2a:00.0", 0), ("0000:18:00.0", 2)):
        (tmp_path / "driver" / "nvidia" / "gpus" / bus).mkdir(parents=True)
        (tmp_path / "driver" / "nvidia" / "gpus" / bus / "information").write_text(
            "Model: \t\t NVIDIA H100 80GB HBM3\nDevice Minor: \t %d\nGPU UUID: \t GPU-%s\n" % (minor, bus)
        )
    table, source = _gpus.minor_map(NO_DRIVER, str(tmp_path))
    assert source == "proc_driver"
    assert [(g["index"], g["minor"], g["uuid"]) for g in table] == [
        (0, 2, "GPU-0000:18:00.0"),
        (1, 0, "GPU-0000:2a:00.0"),
    ]
    assert _gpus.minor_map(None, str(tmp_path))[1] == "proc_driver"  # NVML not asked at all


def proc_driver_tree(root, entries):
    """/proc/driver/nvidia/gpus as the kernel module writes it: [(bus directory, minor, UUID)]."""
    for bus, minor, uuid in entries:
        (root / "driver" / "nvidia" / "gpus" / bus).mkdir(parents=True)
        (root / "driver" / "nvidia" / "gpus" / bus / "information").write_text(
            "Model: \t\t NVIDIA H100 80GB HBM3\nDevice Minor: \t %d\nGPU UUID: \t %s\n" % (minor, uuid)
        )
    return str(root)


def lost(index):
    """A GPU that NVML counts and answers with NVML_ERROR_GPU_IS_LOST (fallen off the bus): its index, nothing more."""
    return dict(nvml_gpu(index, used_mib=None), minor=None, uuid=None, name=None, pci_bus_id=None, error="GPU is lost")


def test_a_lost_gpu_gets_its_minor_from_the_kernel_module(tmp_path):
    proc = proc_driver_tree(tmp_path, [("0000:18:00.0", 0, "GPU-0"), ("0000:19:00.0", 1, "GPU-1")])
    table, source = _gpus.minor_map(driver(nvml_gpu(0), lost(1)), proc)
    assert source == "nvml"
    assert table[1] == {
        "index": 1,
        "minor": 1,
        "uuid": "GPU-1",
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:19:00.0",
    }
    assert table[0] == {
        "index": 0,
        "minor": 0,
        "uuid": "GPU-0",
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:18:00.0",
    }


@pytest.mark.parametrize(
    "entries",
    [
        [("0000:18:00.0", 0, "GPU-0")],  # the kernel knows fewer GPUs than NVML counts
        [("0000:18:00.0", 5, "GPU-0"), ("0000:19:00.0", 1, "GPU-1")],  # it disagrees on the minor of GPU 0
        [],  # no kernel module tables
    ],
)
def test_a_lost_gpu_keeps_no_minor_where_the_kernel_module_does_not_agree_with_nvml(tmp_path, entries):
    proc = proc_driver_tree(tmp_path, entries)
    table, source = _gpus.minor_map(driver(nvml_gpu(0), lost(1)), proc)
    assert source == "nvml" and table[1]["minor"] is None and table[1]["uuid"] is None and table[0]["minor"] == 0


def test_the_holder_of_a_lost_gpus_device_file_is_named():
    """Memory unknown on the lost GPU: the CUDA user of its device file holds it; an NVML client does not."""
    table = [
        {"index": 0, "minor": 0, "uuid": "GPU-0", "name": None, "pci_bus_id": None},
        {"index": 1, "minor": 1, "uuid": "GPU-1", "name": None, "pci_bus_id": None},
    ]
    reading = driver(nvml_gpu(0), lost(1))
    scan = {4000: handles(4000, [1]), 4001: handles(4001, [0, 1], uvm=False)}
    processes = {
        pid: {
            "pid": pid,
            "ppid": 1,
            "pgid": pid,
            "sid": pid,
            "comm": "python3",
            "state": "S",
            "start_ticks": 1,
            "kernel_thread": False,
            "user": "root",
            "uid": 0,
            "cmdline": "python3",
            "start_time": None,
        }
        for pid in scan
    }
    view = _holders.merge(reading, table, scan, processes, 256)
    assert [(h["pid"], h["gpus"], h["attribution"]) for h in view["holders"]] == [(4000, [1], {"1": "device_file"})]
    assert view["unmapped_minors"] == [] and [u["pid"] for u in view["device_users"]] == [4001]


def test_minor_map_without_nvml_or_kernel_module(tmp_path):
    assert _gpus.minor_map(NO_DRIVER, str(tmp_path)) == ([], None)


# --- process_details ---------------------------------------------------------------------------------------------


def test_process_details_of_a_child(spawn):
    child = spawn(["sleep", "60", "1"], wait=True)  # sleep sums its arguments
    details = _gpus.process_details(psutil, child.pid)
    stat = _proc.read_stat(child.pid)
    assert details["pid"] == child.pid and details["ppid"] == os.getpid() and details["comm"] == "sleep"
    assert details["start_ticks"] == stat["start_ticks"] and details["state"] in ("R", "S")
    assert details["uid"] == os.getuid() and details["cmdline"] == "sleep 60 1"
    assert details["start_time"].endswith("+00:00")
    assert abs(psutil.Process(child.pid).create_time() - _iso_seconds(details["start_time"])) < 1e-3


def _iso_seconds(text):
    return datetime.datetime.fromisoformat(text).timestamp()


def test_process_details_of_a_zombie_and_of_a_gone_process(spawn):
    child = spawn(["sleep", "0"])
    wait_for(lambda: (_proc.read_stat(child.pid) or {}).get("state") == "Z", 5, 0.005, "the child to become a zombie")
    details = _gpus.process_details(psutil, child.pid)
    assert details["state"] == "Z" and details["cmdline"] == ""
    child.wait()
    assert _gpus.process_details(psutil, child.pid) is None
    assert _gpus.process_details(psutil, NO_SUCH_PID) is None


class FakePsutil:
    """psutil with a scripted Process: cmdline() returns `argv` or raises `cmdline_error`; `error` raised at once."""

    NoSuchProcess = psutil.NoSuchProcess
    AccessDenied = psutil.AccessDenied
    ZombieProcess = psutil.ZombieProcess

    def __init__(self, argv=(), error=None):
        self.argv, self.error = list(argv), error

    def Process(self, pid):  # pylint: disable=invalid-name
        if self.error:
            raise self.error
        return types.SimpleNamespace(
            oneshot=contextlib.nullcontext,
            uids=lambda: types.SimpleNamespace(real=0),
            create_time=lambda: 0.0,
            cmdline=lambda: list(self.argv),
        )


def test_process_details_strips_setproctitle_padding_and_survives_access_denied():
    details = _gpus.process_details(FakePsutil(["VLLM::Worker_TP0", "", "   "]), os.getpid())
    assert details["cmdline"] == "VLLM::Worker_TP0" and details["user"] == "root" and details["uid"] == 0
    assert details["start_time"] == "1970-01-01T00:00:00+00:00"
    denied = _gpus.process_details(FakePsutil(error=psutil.AccessDenied(os.getpid())), os.getpid())
    assert denied["comm"] == _proc.read_stat(os.getpid())["comm"]
    assert (denied["user"], denied["uid"], denied["cmdline"], denied["start_time"]) == (None, None, None, None)
    assert _gpus.process_details(FakePsutil(error=psutil.NoSuchProcess(os.getpid())), os.getpid()) is None


@pytest.mark.parametrize("padding", [b" " * 200, b"\0" * 200])
def test_a_holder_s_parent_s_command_line_is_read_as_the_holder_s(tmp_path, padding):
    # vLLM's EngineCore, the parent of its TP workers: a setproctitle title padded to the end of the argv area.
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "stat").write_bytes(b"4242 (VLLM::EngineCor) S 1 4242 4242" + b" 0" * 46 + b"\n")
    (tmp_path / "4242" / "cmdline").write_bytes(b"VLLM::EngineCore" + padding)
    inspector = _gpus.Inspector(proc=str(tmp_path))
    assert inspector._parent(4242) == {"pid": 4242, "comm": "VLLM::EngineCor", "cmdline": "VLLM::EngineCore"}
    # The holder's own, from psutil's arguments, in the same words.
    argv = (b"VLLM::EngineCore" + padding).decode().split("\0")
    assert _gpus.process_details(FakePsutil(argv), os.getpid())["cmdline"] == "VLLM::EngineCore"


# --- _listed_pids: when the driver's lists suffice -----------------------------------------------------------------


def test_listed_pids_when_the_lists_explain_every_selected_gpu():
    reading = driver(
        nvml_gpu(0, 70003, [(11, 70000, "compute")]), nvml_gpu(1, 300, [(12, 100, "compute"), (13, 0, "mps")])
    )
    assert _gpus._listed_pids(reading, None, 256) == {11, 12, 13}
    assert _gpus._listed_pids(reading, None, 199) is None  # GPU 1: 200 MiB unexplained > 199
    assert _gpus._listed_pids(reading, None, 200) == {11, 12, 13}  # at the tolerance: explained


def test_listed_pids_ignores_unselected_gpus_but_lists_their_pids():
    reading = driver(
        nvml_gpu(0, 70003, [(11, 70000, "compute")]),
        nvml_gpu(1, 30000, [(12, 100, "compute")]),
        nvml_gpu(2, None, error="Unknown Error"),
    )
    assert _gpus._listed_pids(reading, None, 256) is None
    assert _gpus._listed_pids(reading, [0], 256) == {11, 12}
    assert _gpus._listed_pids(reading, [0, 2], 256) is None  # a lost GPU: full scan


def test_listed_pids_judge_memory_as_merge_does():
    """NVML memory info v1 counts reserved memory as used: the reserved allowance that merge adds to the tolerance
    applies here too, so an idle v1 GPU needs no full scan, and a GPU merge finds unexplained always gets one."""
    v1 = nvml_gpu(0, 600, [(11, 100, "compute")])
    v1["memory"].update(source="nvmlDeviceGetMemoryInfo", reserved_mib=None)
    reading = driver(v1)
    allowance = _holders.reserved_allowance(81559, v1["memory"], reading)
    assert allowance > 500
    assert _gpus._listed_pids(reading, None, 256) == {11}
    view = _holders.merge(reading, _gpus.minor_map(reading)[0], {}, {}, 256)
    assert view["gpus"][0]["memory_unexplained"] is False
    v1["memory"]["used_mib"] = 100 + 256 + allowance + 1
    assert _gpus._listed_pids(reading, None, 256) is None
    assert _holders.merge(reading, _gpus.minor_map(reading)[0], {}, {}, 256)["gpus"][0]["memory_unexplained"] is True


@pytest.mark.parametrize(
    "reading", [NO_DRIVER, driver(), driver(nvml_gpu(0, None)), driver(nvml_gpu(0, 500, [(11, None, "compute")]))]
)
def test_listed_pids_needs_a_full_scan(reading):
    assert _gpus._listed_pids(reading, None, 256) is None


# --- Inspector ---------------------------------------------------------------------------------------------------


def test_inspector_hung_driver_gives_timed_out_view_bounded_by_the_snapshot_timeout(monkeypatch):
    def hang():
        time.sleep(30)

    fake = types.SimpleNamespace(NVMLError=pynvml.NVMLError, nvmlInit=lambda: None, nvmlSystemGetDriverVersion=hang)
    monkeypatch.setattr(_gpus, "pynvml", fake)
    inspector = _gpus.Inspector(driver_timeout=10.0)
    started = time.monotonic()
    try:
        view = inspector.snapshot(timeout=0.3)
        assert inspector.own_pids() == {os.getpid()}  # the hung worker was killed
    finally:
        inspector.close()
    assert time.monotonic() - started < 5
    assert view["driver"]["timed_out"] is True and view["driver"]["available"] is False
    assert "within 0.3 s" in view["driver"]["error"]
    assert os.getpid() not in {h["pid"] for h in view["holders"]}
    assert view["scan"] == "full"


def test_read_driver_bounds_each_query_by_driver_timeout():
    inspector = _gpus.Inspector(driver_timeout=4.0)
    asked = []
    inspector._query = types.SimpleNamespace(
        read=lambda timeout, advice=False: asked.append(timeout) or driver(), pid=None, close=lambda: None
    )
    inspector.read_driver()
    inspector.read_driver(1.5)
    inspector.read_driver(60)
    assert asked == [4.0, 1.5, 4.0]


def handles(pid, minors=(), uvm=True, ctl=True):
    """What _procscan finds for a process: a context holder (`uvm`) maps its device rw-s; an NVML client opens it
    (and nvidia-uvm, as on driver 580.159.04) and maps nothing."""
    found = _procscan.DeviceHandles(pid)
    if ctl:
        found.add("/dev/nvidiactl", "fd")
    found.add("/dev/nvidia-uvm", "fd")
    for minor in minors:
        found.add("/dev/nvidia%d" % minor, "fd")
        if uvm:
            found.add("/dev/nvidia%d" % minor, "mapping", "rw-s")
    return found


@pytest.fixture
def inspector_on(monkeypatch):
    """inspector_on(reading, found) -> (Inspector whose NVML answers `reading` and whose /proc scans find `found`
    ({pid: DeviceHandles}), calls): calls records ("full", skip_pids) and ("listed", pids) scans."""
    calls = []
    made = []

    def install(reading, found):
        def scan_holders(proc="/proc", skip_pids=(), problems=None):
            calls.append(("full", set(skip_pids)))
            return {pid: h for pid, h in found.items() if pid not in set(skip_pids)}

        def scan_pids(pids, proc="/proc"):
            calls.append(("listed", list(pids)))
            return {pid: found[pid] for pid in pids if pid in found}

        monkeypatch.setattr(_procscan, "scan_holders", scan_holders)
        monkeypatch.setattr(_procscan, "scan_pids", scan_pids)
        inspector = _gpus.Inspector()
        inspector.read_driver = lambda timeout=None, advice=False: reading
        made.append(inspector)
        return inspector, calls

    yield install
    for inspector in made:
        inspector.close()


def test_listed_scope_scans_only_the_listed_pids_when_their_memory_explains_the_gpus(spawn, inspector_on, monkeypatch):
    engine, exporter = spawn(["sleep", "60"], wait=True), spawn(["sleep", "61"], wait=True)
    monkeypatch.setattr(_gpus, "initial_pid_namespace", lambda proc="/proc": False)
    reading = driver(nvml_gpu(0, 70003, [(engine.pid, 70000, "compute")]), nvml_gpu(1, 3))
    inspector, calls = inspector_on(
        reading, {engine.pid: handles(engine.pid, [0]), exporter.pid: handles(exporter.pid, [0, 1], uvm=False)}
    )
    view = inspector.snapshot(scope="listed")
    assert calls == [("listed", [engine.pid])] and view["scan"] == "listed"
    (holder,) = view["holders"]
    assert holder["pid"] == engine.pid and holder["gpus"] == [0] and holder["memory_mib"] == {"0": 70000}
    assert holder["attribution"] == {"0": "driver"} and holder["cmdline"] == "sleep 60"
    assert holder["parent"] == {
        "pid": os.getpid(),
        "comm": _proc.read_stat(os.getpid())["comm"],
        "cmdline": " ".join(_proc.read_argv(os.getpid())),
    }
    assert view["device_users"] == []  # NVML clients are not even looked at
    assert "owner" not in holder  # the waits' repeated looks skip the owners unless asked
    assert "owner" in inspector.snapshot(scope="listed", owners=True)["holders"][0]
    assert view["index_source"] == "nvml"
    assert view["driver"] == {
        "available": True,
        "error": None,
        "driver_version": "580.95.05",
        "nvml_version": "13.580.95.05",
        "cuda_driver_version": 13000,
        "timed_out": False,
    }


def test_listed_scope_scans_in_full_where_the_lists_numbers_are_another_namespaces(spawn, inspector_on, monkeypatch):
    """A driver before 535.113.01 seen from a container lists the initial namespace's numbers: no process here is
    found by its number, so the look scans every process, and the one that shows a context on GPU 1 holds it (found
    by generated worlds, tests/worlds/regressions/test_world_aff470c49e.py)."""
    worker, exporter = spawn(["sleep", "60"], wait=True), spawn(["sleep", "61"], wait=True)
    monkeypatch.setattr(_gpus, "initial_pid_namespace", lambda proc="/proc": False)
    reading = driver(nvml_gpu(0, 3), nvml_gpu(1, 503, [(NO_SUCH_PID, 500, "compute")]), version="535.104.05")
    inspector, calls = inspector_on(
        reading, {worker.pid: handles(worker.pid, [1]), exporter.pid: handles(exporter.pid, [0, 1], uvm=False)}
    )
    view = inspector.snapshot(scope="listed")
    assert [call[0] for call in calls] == ["full"] and view["scan"] == "full"
    assert [(h["pid"], h["gpus"], h["attribution"]) for h in view["holders"]] == [
        (worker.pid, [1], {"1": "device_file"})
    ]
    foreign = view["gpus"][1]["foreign"]
    assert foreign == [{"pid": NO_SUCH_PID, "used_mib": 500, "type": "compute", "reason": "absent", "comm": None}]
    assert [u["pid"] for u in view["device_users"]] == [exporter.pid]


def test_listed_scope_rescans_in_full_when_a_listed_creator_has_exited(spawn, inspector_on):
    """535.113.01+: an absent listed PID is a creator that has exited; whoever holds its context is found by a full
    scan (the worker that inherited the handles), and the exporter is left a device user."""
    engine, worker, exporter = (
        spawn(["sleep", "60"], wait=True),
        spawn(["sleep", "62"], wait=True),
        spawn(["sleep", "61"], wait=True),
    )
    reading = driver(
        nvml_gpu(0, 70003, [(engine.pid, 70000, "compute")]), nvml_gpu(1, 5003, [(NO_SUCH_PID, 5000, "compute")])
    )
    inspector, calls = inspector_on(
        reading,
        {
            engine.pid: handles(engine.pid, [0]),
            worker.pid: handles(worker.pid, [1]),
            exporter.pid: handles(exporter.pid, [0, 1], uvm=False),
        },
    )
    view = inspector.snapshot(scope="listed")
    assert calls == [("listed", sorted([engine.pid, NO_SUCH_PID])), ("full", {os.getpid()})] and view["scan"] == "full"
    by_pid = {h["pid"]: h for h in view["holders"]}
    assert sorted(by_pid) == sorted([engine.pid, worker.pid]) and by_pid[worker.pid]["contexts_of"] == {
        "1": [NO_SUCH_PID]
    }
    assert view["gpus"][1]["exited"][0]["reason"] == "exited" and view["gpus"][1]["foreign"] == []


def test_initial_pid_namespace_is_read_from_the_kernels_fixed_inode(tmp_path, monkeypatch):
    """/proc/self/ns/pid of the initial namespace has inode 0xEFFFFFFC (PROC_PID_INIT_INO); anything else is not."""
    (tmp_path / "self" / "ns").mkdir(parents=True)
    (tmp_path / "self" / "ns" / "pid").touch()
    real_stat = os.stat

    def fake_stat(path, *args, **kwargs):
        result = real_stat(path, *args, **kwargs)
        if str(path) == str(tmp_path / "self" / "ns" / "pid"):
            return os.stat_result((result.st_mode, 0xEFFFFFFC) + tuple(result)[2:])
        return result

    assert _gpus.initial_pid_namespace(str(tmp_path)) is False  # a file's own inode
    monkeypatch.setattr(os, "stat", fake_stat)
    assert _gpus.initial_pid_namespace(str(tmp_path)) is True
    assert _gpus.initial_pid_namespace("/nonexistent") is False


def test_full_scope_reports_device_users_and_never_makes_them_holders(spawn, inspector_on):
    engine, exporter = spawn(["sleep", "60"], wait=True), spawn(["sleep", "61"], wait=True)
    reading = driver(nvml_gpu(0, 70003, [(engine.pid, 70000, "compute")]), nvml_gpu(1, 3))
    inspector, calls = inspector_on(
        reading, {engine.pid: handles(engine.pid, [0, 1]), exporter.pid: handles(exporter.pid, [0, 1], uvm=False)}
    )
    view = inspector.snapshot()
    assert calls == [("full", {os.getpid()})] and view["scan"] == "full"
    assert [(h["pid"], h["gpus"]) for h in view["holders"]] == [(engine.pid, [0])]  # GPU 1's file only: not held
    assert [(u["pid"], u["device_gpus"], u["kind"]) for u in view["device_users"]] == [(exporter.pid, [0, 1], "nvml")]
    assert all("owner" in p for p in view["holders"] + view["device_users"])  # a full scan reads the owners


def test_listed_scope_falls_back_to_a_full_scan_for_unexplained_memory(spawn, inspector_on):
    engine, orphan = spawn(["sleep", "60"], wait=True), spawn(["sleep", "62"], wait=True)
    # The device-file rule for memory outside the lists holds on drivers before 535.113.01 (docs/attribution.md).
    reading = driver(nvml_gpu(0, 70003, [(engine.pid, 70000, "compute")]), nvml_gpu(1, 30003), version="535.104.05")
    found = {engine.pid: handles(engine.pid, [0]), orphan.pid: handles(orphan.pid, [1])}
    inspector, calls = inspector_on(reading, found)
    view = inspector.snapshot(scope="listed", tolerance_mib=256)
    assert calls == [("full", {os.getpid()})] and view["scan"] == "full"
    by_pid = {h["pid"]: h for h in view["holders"]}
    assert by_pid[orphan.pid]["attribution"] == {"1": "device_file"} and by_pid[orphan.pid]["memory_mib"] == {"1": None}
    # Only GPU 0 asked for: its memory is explained, so the listed PIDs suffice.
    del calls[:]
    view = inspector.snapshot(scope="listed", indices=[0])
    assert calls == [("listed", [engine.pid])] and view["scan"] == "listed"
    # A tolerance above the unexplained memory: GPU 1 counts as explained, and the orphan holds nothing.
    del calls[:]
    view = inspector.snapshot(scope="listed", tolerance_mib=30003)
    assert calls == [("listed", [engine.pid])] and [h["pid"] for h in view["holders"]] == [engine.pid]
    assert view["gpus"][1]["tolerance_mib"] == 30003 and view["gpus"][1]["memory_unexplained"] is False


def test_without_nvml_the_proc_driver_map_and_a_full_scan_are_used(spawn, inspector_on, monkeypatch):
    worker = spawn(["sleep", "60"], wait=True)
    monkeypatch.setattr(
        _procscan,
        "proc_driver_minors",
        lambda proc="/proc": [
            {"pci_bus_id": "00000000:18:00.0", "minor": 0, "uuid": "GPU-0", "name": "NVIDIA H100 80GB HBM3"}
        ],
    )
    inspector, calls = inspector_on(NO_DRIVER, {worker.pid: handles(worker.pid, [0])})
    view = inspector.snapshot(scope="listed")
    assert calls == [("full", {os.getpid()})] and view["index_source"] == "proc_driver"
    assert view["driver"]["available"] is False and view["driver"]["timed_out"] is False
    # Memory unknown: the CUDA user of the device file holds the GPU.
    assert [(h["pid"], h["attribution"]) for h in view["holders"]] == [(worker.pid, {"0": "device_file"})]
