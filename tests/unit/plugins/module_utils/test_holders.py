# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_holders.merge (pure) with synthetic NVML readings, scans and process details; and the snapshot's /proc helpers
(minor_map, process_details) with real `sleep` children of this test."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _advice, _gpus, _holders, _proc, _procscan
from polling import wait_for

# A PID no process can have (above the kernel's maximum pid_max, 2**22).
NO_SUCH_PID = 5000001


@pytest.fixture
def children():
    """Start N `sleep` children: children(N) -> [pid, ...]; all are killed and reaped afterwards."""
    started = []

    def start(count):
        for _number in range(count):
            started.append(subprocess.Popen(["sleep", "60"]))
        pids = [p.pid for p in started[-count:]]
        # Until the child has exec'd, /proc shows the forked Python with an empty command line.
        wait_for(
            lambda: all(Path("/proc/%d/cmdline" % pid).read_bytes() == b"sleep\x0060\x00" for pid in pids),
            10,
            what="the sleep children's exec",
        )
        return pids

    yield start
    for child in started:
        child.kill()
        child.wait()


def handles(pid, minors=(), ctl=True, uvm=True, mapped=(), seen_in=("fd",), thread_only=False, contexts=None):
    """A scan entry. Default: a process with a context on each GPU whose file it holds (nvidiactl, nvidia-uvm, the
    device files, each mapped rw-s). `contexts=()`: a CUDA-initialized process with no context."""
    contexts = set(minors) | set(mapped) if contexts is None else set(contexts)
    result = _procscan.DeviceHandles(pid)
    result.minors = set(minors) | set(mapped) | contexts
    result.mapped = set(mapped) | contexts
    result.contexts = contexts
    result.ctl, result.uvm = ctl, uvm
    result.control = ctl or uvm
    result.seen_in = set(seen_in) | ({"mapping"} if result.mapped else set())
    result.thread_only = thread_only
    return result


def nvml_client(pid, minors):
    """What NVML leaves open while initialized: /dev/nvidiactl, every /dev/nvidiaN and /dev/nvidia-uvm (twice, on
    driver 580.159.04), no mapping."""
    return handles(pid, minors=minors, uvm=True, contexts=())


def gpu_reading(index, minor, used_mib, processes=(), error=None):
    return {
        "index": index,
        "minor": minor,
        "uuid": "GPU-%d" % index,
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:%02X:00.0" % (0x18 + index),
        "error": error,
        "memory": None
        if used_mib is None
        else {
            "total_mib": 81559,
            "used_mib": used_mib,
            "free_mib": 81559 - used_mib - 529,
            "reserved_mib": 529,
            "source": "nvmlDeviceGetMemoryInfo_v2",
        },
        "processes": [{"pid": p[0], "used_mib": p[1], "type": p[2] if len(p) > 2 else "compute"} for p in processes],
    }


# A driver before 535.113.01: it numbers every PID in the initial PID namespace, whatever the caller's.
OLD_DRIVER = "535.104.05"


def driver(*gpus, version="580.95.05"):
    return {
        "available": True,
        "error": None,
        "driver_version": version,
        "nvml_version": None,
        "cuda_driver_version": None,
        "gpus": list(gpus),
    }


def table(reading):
    return _gpus.minor_map(reading)[0]


def details(*pids, comm="python3"):
    return {
        pid: {
            "pid": pid,
            "ppid": 1,
            "pgid": pid,
            "sid": pid,
            "comm": comm,
            "state": "S",
            "start_ticks": 100 + pid,
            "kernel_thread": False,
            "user": "root",
            "uid": 0,
            "cmdline": comm,
            "start_time": None,
        }
        for pid in pids
    }


def merge(reading, scan, processes=None, **kwargs):
    if processes is None:
        processes = details(*scan)
    return _holders.merge(reading, table(reading) if reading else [], scan, processes, **kwargs)


def by_pid(items):
    return {h["pid"]: h for h in items}


def test_listed_and_confirmed_pid_holds_its_gpu_with_the_listed_memory():
    reading = driver(gpu_reading(0, 5, 3000, processes=[(10, 3000)]), gpu_reading(1, 0, 3))
    view = merge(reading, {10: handles(10, minors=[5])})  # minor 5 is NVML index 0
    (holder,) = view["holders"]
    assert (holder["pid"], holder["gpus"], holder["minors"], holder["memory_mib"]) == (10, [0], [5], {"0": 3000})
    assert holder["attribution"] == {"0": "driver"} and holder["seen_in"] == ["driver", "fd", "mapping"]
    assert holder["kind"] == "cuda" and holder["control_only"] is False
    gpu0, gpu1 = view["gpus"]
    assert (gpu0["index"], gpu0["minor"], gpu1["index"], gpu1["minor"]) == (0, 5, 1, 0)
    assert gpu0["holder_pids"] == [10] and gpu1["holder_pids"] == []
    assert gpu0["driver_processes"] == [{"pid": 10, "used_mib": 3000, "type": "compute", "verified": True}]
    assert (gpu0["explained_mib"], gpu0["unexplained_mib"], gpu0["memory_unexplained"]) == (3000, 0, False)
    assert (gpu1["explained_mib"], gpu1["unexplained_mib"], gpu1["memory_unexplained"]) == (0, 3, False)


def test_nccl_worker_holds_only_the_gpu_the_driver_lists_it_on():
    """NCCL keeps NVML initialized: each TP worker has every /dev/nvidiaN open, the driver lists it on one GPU."""
    reading = driver(
        gpu_reading(0, 0, 70000, processes=[(10, 70000)]),
        gpu_reading(1, 1, 70000, processes=[(11, 70000)]),
        gpu_reading(2, 2, 70000, processes=[(12, 70000)]),
        gpu_reading(3, 3, 0),
    )
    scan = {pid: handles(pid, minors=[0, 1, 2, 3]) for pid in (10, 11, 12)}
    view = merge(reading, scan)
    holders = by_pid(view["holders"])
    assert {pid: h["gpus"] for pid, h in holders.items()} == {10: [0], 11: [1], 12: [2]}
    assert holders[10]["device_gpus"] == [0, 1, 2, 3]
    assert [g["holder_pids"] for g in view["gpus"]] == [[10], [11], [12], []]
    assert view["gpus"][3]["device_user_pids"] == [] and view["device_users"] == []


def test_nvml_client_is_a_device_user_never_a_holder():
    reading = driver(gpu_reading(0, 0, 40000, processes=[(10, 40000)]), gpu_reading(1, 1, 2))
    view = merge(reading, {10: handles(10, minors=[0]), 20: nvml_client(20, [0, 1])})
    assert [h["pid"] for h in view["holders"]] == [10]
    (user,) = view["device_users"]
    assert (user["pid"], user["kind"], user["device_gpus"]) == (20, "nvml", [0, 1])
    assert [g["device_user_pids"] for g in view["gpus"]] == [[20], [20]]
    assert [g["holder_pids"] for g in view["gpus"]] == [[10], []]


def test_unlisted_cuda_user_holds_a_gpu_only_where_memory_is_unexplained_on_older_drivers():
    """Before 535.113.01, in the initial PID namespace (docs/attribution.md rule 5): 3000 MiB outside the lists make
    the CUDA user of GPU 0's file its holder. On GPU 1 the lists explain everything: the same kind of process there is
    a device user (31 started after 30: it cannot hold the context of a dead creator whose number 30 got). Seen from
    a container, the lists' numbers are the host's: 31 shows a context, so it holds GPU 1."""
    reading = driver(gpu_reading(0, 0, 3000), gpu_reading(1, 1, 5000, processes=[(30, 5000)]), version=OLD_DRIVER)
    scan = {20: handles(20, minors=[0]), 31: handles(31, minors=[1]), 30: handles(30, minors=[1])}
    view = merge(reading, scan, initial_pidns=True)
    holders = by_pid(view["holders"])
    assert sorted(holders) == [20, 30]
    assert holders[20]["gpus"] == [0] and holders[20]["memory_mib"] == {"0": None}
    assert holders[20]["attribution"] == {"0": "device_file"} and holders[20]["seen_in"] == ["fd", "mapping"]
    assert [u["pid"] for u in view["device_users"]] == [31]
    assert view["gpus"][0]["memory_unexplained"] is True and view["gpus"][0]["unexplained_mib"] == 3000
    view = merge(reading, scan)
    assert sorted(by_pid(view["holders"])) == [20, 30, 31] and view["device_users"] == []


def test_unexplained_memory_within_the_tolerance_makes_no_holder():
    reading = driver(gpu_reading(0, 0, 256), version=OLD_DRIVER)
    view = merge(reading, {20: handles(20, minors=[0])}, initial_pidns=True)
    assert view["holders"] == [] and view["gpus"][0]["memory_unexplained"] is False
    view = merge(reading, {20: handles(20, minors=[0])}, tolerance_mib=255, initial_pidns=True)
    assert [h["pid"] for h in view["holders"]] == [20]
    assert view["gpus"][0]["tolerance_mib"] == 255


def test_cuda_users_come_before_nvml_clients_which_are_only_suspects():
    reading = driver(gpu_reading(0, 0, 3000), gpu_reading(1, 1, 3000), version=OLD_DRIVER)
    scan = {20: handles(20, minors=[0]), 21: nvml_client(21, [0, 1]), 22: handles(22, minors=[], uvm=False, mapped=[1])}
    view = merge(reading, scan)
    holders = by_pid(view["holders"])
    assert sorted(holders) == [20, 22]  # 22 maps GPU 1's device: a CUDA user
    assert view["gpus"][0]["suspects"] == [] and view["gpus"][1]["suspects"] == []
    view = merge(driver(gpu_reading(0, 0, 3000), version=OLD_DRIVER), {21: nvml_client(21, [0])})
    assert view["holders"] == [] and view["gpus"][0]["suspects"] == [21]
    assert [u["pid"] for u in view["device_users"]] == [21]


def test_listed_process_is_no_candidate_for_other_gpus_unexplained_memory():
    reading = driver(gpu_reading(0, 0, 5000, processes=[(10, 5000)]), gpu_reading(1, 1, 3000), version=OLD_DRIVER)
    view = merge(reading, {10: handles(10, minors=[0, 1]), 20: handles(20, minors=[1])})
    holders = by_pid(view["holders"])
    assert holders[10]["gpus"] == [0] and holders[20]["gpus"] == [1]


def test_absent_listed_pid_is_foreign_and_its_memory_is_explained_on_older_drivers_in_a_container():
    """Before 535.113.01 a container sees the host's numbers: an absent listed PID may be a host process, or this
    container's process 20 under its host number. 20 shows a context on GPU 0: it holds GPU 0 (found by generated
    worlds: the worker of a creator that exited was left out), its memory not known."""
    reading = driver(gpu_reading(0, 0, 6000, processes=[(NO_SUCH_PID, 6000)]), version=OLD_DRIVER)
    view = merge(reading, {20: handles(20, minors=[0]), 21: nvml_client(21, [0])})
    gpu = view["gpus"][0]
    assert [(h["pid"], h["memory_mib"], h["attribution"]) for h in view["holders"]] == [
        (20, {"0": None}, {"0": "device_file"})
    ]
    assert gpu["holder_pids"] == [20] and [u["pid"] for u in view["device_users"]] == [21]
    assert gpu["foreign"] == [
        {"pid": NO_SUCH_PID, "used_mib": 6000, "type": "compute", "reason": "absent", "comm": None}
    ]
    assert gpu["driver_processes"][0]["verified"] is False
    assert (gpu["unexplained_mib"], gpu["memory_unexplained"]) == (0, False)


def test_listed_pid_present_here_but_holding_another_gpu_is_foreign_on_older_drivers_in_a_container():
    """Before 535.113.01, inside a container the driver's host PID 7 on GPU 0 may be the container's own PID 7, which
    computes on GPU 1: it holds GPU 1 (it shows a context there), never GPU 0."""
    reading = driver(
        gpu_reading(0, 0, 4000, processes=[(7, 4000)]),
        gpu_reading(1, 1, 2000, processes=[(900007, 2000)]),
        version=OLD_DRIVER,
    )
    view = merge(reading, {7: handles(7, minors=[1])})
    assert [(h["pid"], h["gpus"]) for h in view["holders"]] == [(7, [1])]
    assert view["gpus"][0]["foreign"] == [
        {"pid": 7, "used_mib": 4000, "type": "compute", "reason": "not_holding", "comm": "python3"}
    ]
    assert view["gpus"][1]["foreign"][0]["reason"] == "absent"
    assert view["device_users"] == []


def test_mps_client_is_listed_twice_and_counted_once():
    """Driver 580.159.04 on an H200 lists an MPS client in the compute list and the MPS list with the same memory (1540
    MiB), the server in the compute list (66 MiB); both map the GPU's file rw-s. The client holds 1540 MiB, once."""
    reading = driver(gpu_reading(0, 0, 1614, processes=[(40, 66), (41, 1540), (41, 1540, "mps"), (42, 900, "mps")]))
    scan = {40: handles(40, minors=[0]), 41: handles(41, minors=[0]), 42: nvml_client(42, [0])}
    view = merge(reading, scan)
    holders = by_pid(view["holders"])
    assert sorted(holders) == [40, 41]
    assert holders[41]["memory_mib"] == {"0": 1540} and holders[40]["memory_mib"] == {"0": 66}
    gpu = view["gpus"][0]
    assert gpu["explained_mib"] == 66 + 1540 + 900 and gpu["unexplained_mib"] == 0
    # 42's number is listed but it shows no context: a reused number, never a holder.
    assert [(e["pid"], e["reason"]) for e in gpu["exited"]] == [(42, "reused")]


def test_a_pid_in_two_lists_is_one_exited_entry():
    reading = driver(gpu_reading(0, 0, 1540, processes=[(41, 1540), (41, 1540, "mps")]))
    view = merge(reading, {}, details())
    assert [(e["pid"], e["used_mib"], e["type"]) for e in view["gpus"][0]["exited"]] == [(41, 1540, "compute")]


def test_list_entry_without_a_figure_explains_the_gpu():
    reading = driver(gpu_reading(0, 0, 9000, processes=[(10, None)]))
    view = merge(reading, {10: handles(10, minors=[0]), 20: handles(20, minors=[0])})
    assert [h["pid"] for h in view["holders"]] == [10] and view["holders"][0]["memory_mib"] == {"0": None}
    assert (view["gpus"][0]["unexplained_mib"], view["gpus"][0]["memory_unexplained"]) == (None, False)


def test_unknown_memory_makes_cuda_users_of_the_device_file_holders():
    """A lost GPU (or no driver with a /proc/driver map): memory unknown, so CUDA users of its file hold it."""
    reading = driver(gpu_reading(0, 0, None, error="GPU is lost"))
    view = merge(reading, {20: handles(20, minors=[0]), 21: nvml_client(21, [0])})
    assert [h["pid"] for h in view["holders"]] == [20]
    assert view["gpus"][0]["memory_unexplained"] is True and view["gpus"][0]["unexplained_mib"] is None


def test_holder_listed_twice_in_one_list_shares_its_number_with_a_dead_creator():
    """Two entries under one PID on a GPU without MIG instances are two driver clients with one number: the process's
    own context and a dead creator's. Their memory is listed under that number together (3000 MiB), not the process's
    alone; nobody here shows the dead creator's context (issue 40, item 8)."""
    reading = driver(gpu_reading(0, 0, 3000, processes=[(10, 1000), (10, 2000)]))
    view = merge(reading, {10: handles(10, minors=[0])})
    assert [h["pid"] for h in view["holders"]] == [10] and view["holders"][0]["memory_mib"] == {"0": None}
    gpu = view["gpus"][0]
    assert gpu["exited"] == [{"pid": 10, "used_mib": 3000, "type": "compute", "reason": "reused", "comm": "python3"}]
    assert (gpu["explained_mib"], gpu["memory_unexplained"]) == (3000, False)


def shared_number_scene(*entries):
    """GPU 0 (no MIG) lists PID 4321 with `entries` and PID 50 (a live job, 1000 MiB). 4321 started at tick 5000 and
    has a context of its own; 21 started at tick 1000 under init and shows a context that the lists leave out: it
    cannot be 4321's (it is older) nor 50's (no descendant): the context of the creator that had 4321 before. 22 is a
    forked child of 4321, 23 one of 50 (older than 4321): they hold their live parents' contexts, device users; 30 an
    NVML exporter."""
    reading = driver(gpu_reading(0, 0, 8003, processes=[(50, 1000)] + [(4321, mib) for mib in entries]))
    scan = {pid: handles(pid, minors=[0]) for pid in (4321, 50, 21, 22, 23)}
    scan[30] = nvml_client(30, [0])
    processes = details(4321, 50, 21, 22, 23, 30)
    for pid, ppid, ticks in ((4321, 1, 5000), (50, 1, 100), (21, 1, 1000), (22, 4321, 6000), (23, 50, 2000)):
        processes[pid].update(ppid=ppid, start_ticks=ticks)
    return merge(reading, scan, processes)


@pytest.mark.parametrize("entries", [(7000,), (2000, 5000)], ids=["listed once", "listed twice"])
def test_a_reused_number_with_its_own_context_shares_the_dead_creators_memory_with_the_holders_of_that_context(entries):
    """A dead creator's PID went to a process with a context of its own on the same GPU, while the creator's forked
    child holds its context: the driver lists the number once with both contexts' memory (gpu_rmapi.c), or twice. The
    child is a holder of the dead creator's context, so a dry run names it as the run ends it; the listed memory is
    the two contexts' together (issue 40, item 8)."""
    view = shared_number_scene(*entries)
    holders = by_pid(view["holders"])
    assert sorted(holders) == [21, 50, 4321] and sorted(u["pid"] for u in view["device_users"]) == [22, 23, 30]
    assert holders[4321]["attribution"] == {"0": "driver"} and holders[4321]["memory_mib"] == {"0": None}
    assert holders[50]["memory_mib"] == {"0": 1000} and holders[50]["contexts_of"] == {}
    assert holders[21]["attribution"] == {"0": "device_file"} and holders[21]["contexts_of"] == {"0": [4321]}
    assert holders[21]["memory_mib"] == {"0": None}
    gpu = view["gpus"][0]
    assert gpu["exited"] == [{"pid": 4321, "used_mib": 7000, "type": "compute", "reason": "reused", "comm": "python3"}]
    assert (gpu["explained_mib"], gpu["unexplained_mib"], gpu["memory_unexplained"]) == (8000, 3, False)
    assert gpu["holder_pids"] == [21, 50, 4321]
    assert _advice.exited_notes(view) == [
        "GPU 0: PID 21 holds the context of PID 4321, which has exited; PID 4321 here (python3) got its number and "
        "holds a context of its own there: the driver lists 7000 MiB under PID 4321 for both"
    ]


@pytest.mark.parametrize("creator_end", ["zombie", "reaped"])
def test_an_exited_creators_worker_older_than_a_live_holder_is_no_evidence_of_a_shared_number(creator_end):
    """Trainer 7 forked worker 8 and exited: a zombie its launcher has not reaped (the number still 7's, the creator
    itself) or reaped (the number free). The driver lists 7 with its context's 512 MiB, which 8 holds; 5 and 9 are
    live holders listed under their own numbers, and 9 started after 8. 8's context is 7's, listed: 9 shares no
    number, it holds its own 512 MiB, and 7 is the only exited creator (found by a generated world)."""
    reading = driver(gpu_reading(0, 0, 1536, processes=[(5, 512), (9, 512), (7, 512)]))
    scan = {pid: handles(pid, minors=[0]) for pid in (5, 8, 9)}
    processes = details(5, 8, 9)
    processes[8].update(comm="pt_data_worker", cmdline="pt_data_worker", start_ticks=300)
    processes[9].update(start_ticks=400)
    if creator_end == "zombie":
        processes.update(details(7, comm="python3 train.p"))
        processes[7].update(ppid=6, state="Z", cmdline="", start_ticks=200)
    view = merge(reading, scan, processes)
    gpu = view["gpus"][0]
    comm = "python3 train.p" if creator_end == "zombie" else None
    assert gpu["exited"] == [{"pid": 7, "used_mib": 512, "type": "compute", "reason": "exited", "comm": comm}]
    holders = by_pid(view["holders"])
    assert sorted(holders) == [5, 8, 9]
    assert holders[9]["memory_mib"] == {"0": 512} and holders[9]["contexts_of"] == {}
    assert holders[8]["attribution"] == {"0": "device_file"} and holders[8]["contexts_of"] == {"0": [7]}
    assert holders[8]["memory_mib"] == {"0": 512}  # it alone holds 7's context
    assert _advice.exited_notes(view) == ["GPU 0: PID 8 holds the context of PID 7 (512 MiB), which has exited"]


def test_a_number_shared_with_a_dead_creator_is_the_one_its_child_holds_elsewhere():
    """Trainer 12 made contexts on GPUs 0 and 1, forked worker 13 and exited; its number went to 12, a server with a
    context of its own on GPU 0 only. GPU 1 lists 12 (the creator's context: the server shows none there), which 13
    holds. GPU 0 lists 12 (both contexts, 1024 MiB), 17 and 18 (512 MiB each, their own), all started after 13: 13's
    context there is the same creator's, under 12, not 17's nor 18's (found by a generated world: all three were taken
    for reused numbers, and the wait then waited for 17's and 18's memory as a dead creator's)."""
    reading = driver(
        gpu_reading(0, 0, 2048, processes=[(12, 1024), (17, 512), (18, 512)]),
        gpu_reading(1, 1, 512, processes=[(12, 512)]),
    )
    scan = {12: handles(12, minors=[0, 1], contexts=[0]), 13: handles(13, minors=[0, 1])}
    scan.update({pid: handles(pid, minors=[0]) for pid in (17, 18)})
    processes = details(12, 13, 17, 18)
    for pid, ticks in ((13, 300), (12, 400), (17, 401), (18, 401)):
        processes[pid]["start_ticks"] = ticks
    view = merge(reading, scan, processes)
    holders = by_pid(view["holders"])
    assert holders[13]["contexts_of"] == {"0": [12], "1": [12]}, holders[13]
    assert holders[17]["memory_mib"] == {"0": 512} and holders[18]["memory_mib"] == {"0": 512}
    assert holders[12]["memory_mib"] == {"0": None}
    assert [(e["pid"], e["used_mib"], e["reason"]) for e in view["gpus"][0]["exited"]] == [(12, 1024, "reused")]
    assert [(e["pid"], e["used_mib"], e["reason"]) for e in view["gpus"][1]["exited"]] == [(12, 512, "reused")]


@pytest.mark.parametrize("first", [17, 19])
def test_a_number_shared_with_a_dead_creator_on_two_gpus_is_the_one_both_allow(first):
    """Trainer 12 made contexts on GPUs 0 and 1, forked worker 13 and exited; its number went to 12, a server with
    contexts of its own on both. No list names an exited creator. GPU 0 lists 12 and `first`, GPU 1 12 and the other of
    17 and 19, all started after 13: 13's contexts are the one creator's, under the one number both GPUs allow, 12,
    whichever GPU is looked at first (a reviewer's case: the first GPU's guess was taken for evidence on the second)."""
    other = 36 - first
    reading = driver(
        gpu_reading(0, 0, 1536, processes=[(12, 1024), (first, 512)]),
        gpu_reading(1, 1, 1536, processes=[(12, 1024), (other, 512)]),
    )
    scan = {12: handles(12, minors=[0, 1]), 13: handles(13, minors=[0, 1])}
    scan.update({first: handles(first, minors=[0]), other: handles(other, minors=[1])})
    processes = details(12, 13, 17, 19)
    for pid, ticks in ((13, 300), (12, 400), (17, 401), (19, 401)):
        processes[pid]["start_ticks"] = ticks
    holders = by_pid(merge(reading, scan, processes)["holders"])
    assert holders[13]["contexts_of"] == {"0": [12], "1": [12]}, holders[13]
    assert holders[17]["memory_mib"] == {str(int(first != 17)): 512} and holders[19]["contexts_of"] == {}


def test_excluded_pids_are_never_holders_nor_users():
    reading = driver(gpu_reading(0, 0, 2000, processes=[(10, 1000), (11, 1000)]))
    view = merge(reading, {10: handles(10, minors=[0]), 11: handles(11, minors=[0])}, exclude_pids=[10])
    assert [h["pid"] for h in view["holders"]] == [11] and view["device_users"] == []
    assert {p["pid"]: p["verified"] for p in view["gpus"][0]["driver_processes"]} == {10: False, 11: True}
    assert view["gpus"][0]["foreign"] == []  # our own NVML worker is not foreign either


def test_vanished_process_is_dropped():
    reading = driver(gpu_reading(0, 0, 3000))
    view = merge(reading, {NO_SUCH_PID: handles(NO_SUCH_PID, minors=[0])}, processes={})
    assert view["holders"] == [] and view["device_users"] == []


def test_unmapped_minors_and_no_map_at_all():
    reading = driver(gpu_reading(0, 0, 10))
    view = merge(reading, {20: handles(20, minors=[7])})
    assert view["unmapped_minors"] == [7] and view["holders"] == []
    view = _holders.merge(None, [], {20: handles(20, minors=[0]), 21: nvml_client(21, [0])}, details(20, 21))
    assert view["gpus"] == [] and [h["pid"] for h in view["holders"]] == [20]
    assert view["holders"][0]["gpus"] == [] and [u["pid"] for u in view["device_users"]] == [21]


def test_holder_details_describe_the_real_process(children):
    (pid,) = children(1)
    holder = _gpus.process_details(psutil, pid)
    assert holder["ppid"] == os.getpid()
    assert holder["comm"] == "sleep" and holder["cmdline"] == "sleep 60"
    assert holder["uid"] == os.getuid() and holder["state"] in ("S", "R")
    assert holder["start_ticks"] == _proc.read_start_ticks(pid)
    assert holder["pgid"] == os.getpgid(pid) and holder["sid"] == os.getsid(pid)
    assert _gpus.process_details(psutil, NO_SUCH_PID) is None


def test_without_nvml_the_map_comes_from_proc_driver(tmp_path):
    for bus, minor in (("0000:2a:00.0", 0), ("0000:18:00.0", 3)):
        (tmp_path / "driver" / "nvidia" / "gpus" / bus).mkdir(parents=True)
        (tmp_path / "driver" / "nvidia" / "gpus" / bus / "information").write_text(
            "Model: \t\t NVIDIA H100 80GB HBM3\nGPU UUID: \t GPU-%s\nDevice Minor: \t %d\n" % (bus, minor)
        )
    gpus, source = _gpus.minor_map({"available": False, "gpus": []}, str(tmp_path))
    assert source == "proc_driver"
    assert [(gpu["index"], gpu["minor"], gpu["pci_bus_id"]) for gpu in gpus] == [
        (0, 3, "00000000:18:00.0"),
        (1, 0, "00000000:2A:00.0"),
    ]
    view = _holders.merge(None, gpus, {20: handles(20, minors=[0])}, details(20))
    assert [(gpu["index"], gpu["memory_used_mib"], gpu["unexplained_mib"]) for gpu in view["gpus"]] == [
        (0, None, None),
        (1, None, None),
    ]
    assert view["holders"][0]["gpus"] == [1]  # minor 0 is index 1 in PCI order; memory unknown


def test_without_nvml_and_kernel_module_there_is_no_map(tmp_path):
    assert _gpus.minor_map(None, str(tmp_path)) == ([], None)


# ---- the driver as its source says (docs/attribution.md; tests/sim/README.md "The driver model") ----


def test_exited_creator_is_named_and_the_cuda_users_of_its_gpu_hold_its_context():
    """A trainer forked DataLoader workers and was SIGKILLed: the driver still lists its PID with 6000 MiB. The CUDA
    users of GPU 0's file that the lists leave out hold that context; the NVML exporter does not; GPU 1's CUDA user
    (nothing exited there) is a device user."""
    reading = driver(gpu_reading(0, 0, 6003, processes=[(NO_SUCH_PID, 6000)]), gpu_reading(1, 1, 3))
    scan = {
        21: handles(21, minors=[0]),
        22: handles(22, minors=[0]),
        30: nvml_client(30, [0, 1]),
        40: handles(40, minors=[1]),
    }
    view = merge(reading, scan)
    gpu = view["gpus"][0]
    assert gpu["foreign"] == [] and gpu["exited"] == [
        {"pid": NO_SUCH_PID, "used_mib": 6000, "type": "compute", "reason": "exited", "comm": None}
    ]
    assert (gpu["explained_mib"], gpu["unexplained_mib"], gpu["memory_unexplained"]) == (6000, 3, False)
    holders = by_pid(view["holders"])
    assert sorted(holders) == [21, 22] and gpu["holder_pids"] == [21, 22]
    assert all(
        h["attribution"] == {"0": "device_file"} and h["contexts_of"] == {"0": [NO_SUCH_PID]} for h in holders.values()
    )
    assert sorted(u["pid"] for u in view["device_users"]) == [30, 40]
    assert _advice.exited_notes(view) == [
        "GPU 0: PID 21, 22 hold the context of PID %d (6000 MiB), which has exited" % NO_SUCH_PID
    ]


def test_reused_pid_of_an_nvml_client_is_never_confirmed():
    """The exporter started later got the dead trainer's number: it holds every device file and no context. It is named
    (reason reused), never a holder; the worker that holds the context is."""
    reading = driver(gpu_reading(0, 0, 5000, processes=[(30, 5000)]))
    view = merge(reading, {30: nvml_client(30, [0]), 21: handles(21, minors=[0])}, details(30, 21, comm="exporter"))
    gpu = view["gpus"][0]
    assert gpu["exited"] == [{"pid": 30, "used_mib": 5000, "type": "compute", "reason": "reused", "comm": "exporter"}]
    assert gpu["driver_processes"][0]["verified"] is False
    assert [h["pid"] for h in view["holders"]] == [21] and view["holders"][0]["contexts_of"] == {"0": [30]}
    assert [u["pid"] for u in view["device_users"]] == [30]
    assert _advice.exited_notes(view) == [
        "GPU 0: PID 21 holds the context of PID 30 (5000 MiB), which has exited; PID 30 here (exporter) is another "
        "process that got its number and is left alone"
    ]


def test_exited_creator_with_no_cuda_user_here_names_the_nvml_clients_as_suspects_only():
    reading = driver(gpu_reading(0, 0, 5000, processes=[(NO_SUCH_PID, 5000)]))
    view = merge(reading, {30: nvml_client(30, [0])})
    assert view["holders"] == [] and view["gpus"][0]["suspects"] == [30]


@pytest.mark.parametrize("initial, cause", [(False, "other_namespace_or_leaked"), (True, "leaked")])
def test_memory_outside_the_lists_of_a_translating_driver_is_nobody_here(initial, cause):
    """535.113.01+: the lists leave out creators that have no number in this PID namespace. Memory outside them is
    another namespace's or leaked (only leaked in the initial namespace): never this namespace's CUDA users."""
    reading = driver(gpu_reading(0, 0, 8000, processes=[(10, 2000)]))
    view = merge(reading, {10: handles(10, minors=[0]), 20: handles(20, minors=[0])}, initial_pidns=initial)
    gpu = view["gpus"][0]
    assert [h["pid"] for h in view["holders"]] == [10] and [u["pid"] for u in view["device_users"]] == [20]
    assert (gpu["unexplained_mib"], gpu["memory_unexplained"], gpu["unexplained_cause"]) == (6000, True, cause)


def test_older_driver_in_the_initial_namespace_takes_absent_pids_as_exited():
    """Before 535.113.01 every PID is the initial namespace's: seen from there, an absent one has exited."""
    reading = driver(gpu_reading(0, 0, 3000, processes=[(NO_SUCH_PID, 3000)]), version=OLD_DRIVER)
    view = merge(reading, {21: handles(21, minors=[0])}, initial_pidns=True)
    assert view["gpus"][0]["exited"][0]["reason"] == "exited" and view["gpus"][0]["foreign"] == []
    assert [h["pid"] for h in view["holders"]] == [21]
    assert _holders.translates_pids({"driver_version": "535.113.01"}) is True
    assert _holders.translates_pids({"driver_version": "535.104.05"}) is False
    assert _holders.translates_pids({"driver_version": None}) is None


def test_memory_not_supported_gpu_is_judged_by_its_lists_and_device_files():
    """A GB10: no memory figures. The listed compositor and EngineCore hold it; the CUDA tool without a context is a
    device user; nothing is unexplained, nothing is an error."""
    reading = driver(gpu_reading(0, 0, None, processes=[(10, 60000), (11, 43, "graphics")]))
    reading["gpus"][0]["memory"] = {
        "total_mib": None,
        "used_mib": None,
        "free_mib": None,
        "reserved_mib": None,
        "source": None,
        "used_includes_reserved": None,
        "used_excluding_reserved_mib": None,
        "supported": False,
    }
    view = merge(
        reading,
        {10: handles(10, minors=[0]), 11: handles(11, minors=[0], uvm=False, mapped=[0]), 20: handles(20, minors=[0])},
    )
    gpu = view["gpus"][0]
    assert gpu["memory_supported"] is False and gpu["error"] is None
    # Its used memory is what the lists charge: a wait releases it once no listed holder is left.
    assert (gpu["memory_used_mib"], gpu["memory_source"]) == (60043, "process_lists")
    assert (gpu["unexplained_mib"], gpu["memory_unexplained"], gpu["unexplained_cause"]) == (0, False, None)
    assert sorted(h["pid"] for h in view["holders"]) == [10, 11] and [u["pid"] for u in view["device_users"]] == [20]
    assert _holders.lists_explain(reading["gpus"][0], reading, 256) is True
