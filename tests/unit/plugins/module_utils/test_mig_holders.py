# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""MIG instances and NVML memory info v1 through merge (_holders) and selection (_select), and the MIG capability
files of _procscan: synthetic NVML readings shaped like _nvml.read_gpu's, scans with capability files, real merges."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus, _holders, _procscan, _release, _select

OWN_CHAIN = {1, 700}
# The default layout of the simulator (tests/sim/README.md "MIG"): GPU instances 2 (3g), 4 (2g), 7 (1g), CI 0 each.
LAYOUT = ((2, "3g.40gb", 40448), (4, "2g.20gb", 20096), (7, "1g.10gb", 9984))


def cap_minors(gpu_minor, gi, ci=0):
    """The capability files (GPU instance, compute instance) a CUDA process on that instance holds (docs/mig.md)."""
    first = 3 + 135 * gpu_minor + 9 * gi
    return {first, first + 1 + ci}


def mig_gpu(index, used_by_gi, processes=(), memory_source="nvmlDeviceGetMemoryInfo_v2"):
    """A MIG-enabled GPU with the default layout; `used_by_gi` {gi: MiB}; processes (pid, MiB, gi) on the parent."""
    devices = [
        {
            "index": k,
            "uuid": "MIG-%d-%d" % (index, gi),
            "gpu_instance_id": gi,
            "compute_instance_id": 0,
            "name": "NVIDIA H100 80GB HBM3 MIG " + profile,
            "profile": profile,
            "memory_total_mib": total,
            "memory_used_mib": used_by_gi.get(gi, 0),
            "memory_free_mib": total - used_by_gi.get(gi, 0),
            "memory_source": memory_source,
        }
        for k, (gi, profile, total) in enumerate(LAYOUT)
    ]
    used = sum(used_by_gi.values())
    return {
        "index": index,
        "minor": index,
        "uuid": "GPU-%d" % index,
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": None,
        "error": None,
        "mig_mode": {"current": True, "pending": True},
        "mig_devices": devices,
        "process_list_version": "v3",
        "processes_error": None,
        "memory": {
            "total_mib": 81559,
            "used_mib": used,
            "free_mib": 81559 - 529 - used,
            "reserved_mib": 529,
            "source": "nvmlDeviceGetMemoryInfo_v2",
            "used_includes_reserved": False,
            "used_excluding_reserved_mib": used,
        },
        "processes": [
            {
                "pid": pid,
                "used_mib": mib,
                "type": "compute",
                "gpu_instance_id": gi,
                "compute_instance_id": None if gi is None else 0,
            }
            for pid, mib, gi in processes
        ],
    }


def plain_gpu(index, used, processes=(), v1=False):
    memory = (
        {
            "total_mib": 81559,
            "used_mib": used + 529,
            "free_mib": 81559 - 529 - used,
            "reserved_mib": None,
            "source": "nvmlDeviceGetMemoryInfo",
            "used_includes_reserved": True,
            "used_excluding_reserved_mib": None,
        }
        if v1
        else {
            "total_mib": 81559,
            "used_mib": used,
            "free_mib": 81559 - 529 - used,
            "reserved_mib": 529,
            "source": "nvmlDeviceGetMemoryInfo_v2",
            "used_includes_reserved": False,
            "used_excluding_reserved_mib": used,
        }
    )
    return {
        "index": index,
        "minor": index,
        "uuid": "GPU-%d" % index,
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": None,
        "error": None,
        "mig_mode": {"current": False, "pending": False},
        "mig_devices": [],
        "memory": memory,
        "process_list_version": "v3",
        "processes_error": None,
        "processes": [
            {"pid": pid, "used_mib": mib, "type": "compute", "gpu_instance_id": None, "compute_instance_id": None}
            for pid, mib in processes
        ],
    }


def cuda(pid, minors, caps=()):
    """A process with a context on the parent GPU of its MIG instance: it maps the parent's device file rw-s."""
    handles = _procscan.DeviceHandles(pid)
    handles.minors, handles.ctl, handles.uvm, handles.control = set(minors), True, True, True
    handles.mapped = handles.contexts = set(minors)
    handles.seen_in, handles.caps = {"fd", "mapping"}, set(caps)
    return handles


# Most tests here model memory outside the lists as the device-file rule of drivers before 535.113.01 does
# (docs/attribution.md, rule 5); test_exited_creator_on_an_instance... is the current driver.
OLD_DRIVER = "535.104.05"


def view_of(gpus, scan, driver_version=OLD_DRIVER, **kwargs):
    reading = {
        "available": True,
        "error": None,
        "driver_version": driver_version,
        "nvml_version": None,
        "cuda_driver_version": None,
        "gpus": list(gpus),
    }
    processes = {
        pid: {
            "pid": pid,
            "ppid": 1,
            "pgid": pid,
            "sid": pid,
            "comm": "python3",
            "state": "S",
            "start_ticks": pid,
            "kernel_thread": False,
            "user": "root",
            "uid": 0,
            "cmdline": "python3",
            "start_time": None,
        }
        for pid in (h.pid for h in scan)
    }
    view = _holders.merge(reading, _gpus.minor_map(reading)[0], {h.pid: h for h in scan}, processes, **kwargs)
    view["driver"] = {"available": True, "timed_out": False}
    return view


def instances(view, index=0):
    return {d["gpu_instance_id"]: d for d in view["gpus"][index]["mig_devices"]}


def three_orphans():
    """GPU 0 in MIG mode with a holder on each instance: 2 listed, 4 and 7 only holding the handles (not listed)."""
    return view_of(
        [mig_gpu(0, {2: 7000, 4: 5000, 7: 3000}, processes=[(10, 7000, 2)])],
        [cuda(10, [0], cap_minors(0, 2)), cuda(11, [0], cap_minors(0, 4)), cuda(12, [0], cap_minors(0, 7))],
    )


def test_listed_and_handle_only_holders_are_assigned_to_their_instances():
    view = three_orphans()
    by_gi = instances(view)
    assert {
        gi: (d["holder_pids"], d["listed_mib"], d["unexplained_mib"], d["memory_unexplained"])
        for gi, d in by_gi.items()
    } == {2: ([10], 7000, 0, False), 4: ([11], 0, 5000, True), 7: ([12], 0, 3000, True)}
    holders = {h["pid"]: h for h in view["holders"]}
    assert {pid: (h["mig"], h["attribution"]) for pid, h in holders.items()} == {
        10: ({"0": ["MIG-0-2"]}, {"0": "driver"}),
        11: ({"0": ["MIG-0-4"]}, {"0": "device_file"}),
        12: ({"0": ["MIG-0-7"]}, {"0": "device_file"}),
    }


def test_handle_only_process_on_an_explained_instance_is_no_holder():
    """Instance 4's memory is explained by its listed process: a CUDA user with instance 4's capability files that
    the driver does not list is a device user in the initial PID namespace, even though the GPU as a whole has
    unexplained memory (instance 7)."""
    gpus = [mig_gpu(0, {4: 5000, 7: 3000}, processes=[(10, 5000, 4)])]
    scan = [cuda(10, [0], cap_minors(0, 4)), cuda(11, [0], cap_minors(0, 4)), cuda(12, [0], cap_minors(0, 7))]
    view = view_of(gpus, scan, initial_pidns=True)
    assert sorted(h["pid"] for h in view["holders"]) == [10, 12]
    assert [u["pid"] for u in view["device_users"]] == [11]
    # Seen from a container, the lists' numbers are the host's: 11 shows a context on instance 4, so it holds it.
    view = view_of(gpus, scan)
    assert sorted(h["pid"] for h in view["holders"]) == [10, 11, 12] and view["device_users"] == []


def test_capability_files_from_mig_minors_override_the_fixed_numbering():
    caps = {500: (0, 4, None), 501: (0, 4, 0)}
    view = view_of([mig_gpu(0, {4: 5000})], [cuda(11, [0], {500, 501})], caps=caps)
    assert instances(view)[4]["holder_pids"] == [11]
    view = view_of([mig_gpu(0, {4: 5000})], [cuda(11, [0], {500, 501})])  # fixed numbering: 500 is GPU 3's
    assert instances(view)[4]["holder_pids"] == [] and view["holders"][0]["mig"] == {}


def test_foreign_entry_is_reported_on_its_instance():
    view = view_of([mig_gpu(0, {7: 3000}, processes=[(5000001, 3000, 7)])], [])
    assert [f["pid"] for f in instances(view)[7]["foreign"]] == [5000001]
    assert instances(view)[7]["memory_unexplained"] is False


def test_mig_uuid_selects_one_instance_and_the_parent_every_instance():
    view = three_orphans()
    one = _select.Selection(_select.select_gpus(["MIG-0-4"], view), own_chain=OWN_CHAIN)
    assert (list(one.indices), one.indices.instances) == ([0], {0: frozenset(["MIG-0-4"])})
    assert [h["pid"] for h in one.split(view)["targets"]] == [11]
    status = _release.gpu_status(one, view, 256)
    assert [
        (s["index"], s["mig_uuid"], s["memory_used_mib"], [h["pid"] for h in s["holders"]], s["released"])
        for s in status
    ] == [(0, "MIG-0-4", 5000, [11], False)]
    for whole in (["GPU-0"], [0], ["MIG-0-4", "0"]):
        selection = _select.Selection(_select.select_gpus(whole, view), own_chain=OWN_CHAIN)
        assert selection.instances == {} and [h["pid"] for h in selection.split(view)["targets"]] == [10, 11, 12]
        assert [s["mig_uuid"] for s in _release.gpu_status(selection, view, 256)] == [None]


def test_instance_is_released_when_its_holder_is_gone_whatever_its_neighbours_hold():
    view = view_of(
        [mig_gpu(0, {2: 7000, 7: 3000}, processes=[(10, 7000, 2)])],
        [cuda(10, [0], cap_minors(0, 2)), cuda(12, [0], cap_minors(0, 7))],
    )
    selection = _select.Selection(_select.select_gpus(["MIG-0-4", "MIG-0-7"], view), own_chain=OWN_CHAIN)
    status = {s["mig_uuid"]: s for s in _release.gpu_status(selection, view, 256)}
    assert status["MIG-0-4"]["released"] is True and status["MIG-0-7"]["released"] is False
    gone = dict(view, gpus=[dict(view["gpus"][0], mig_devices=view["gpus"][0]["mig_devices"][:2])])
    assert "no longer there" in _release.gpu_status(selection, gone, 256)[1]["error"]


def test_unknown_mig_uuid_is_refused_naming_the_known_ones():
    with pytest.raises(_select.SelectionError, match=r"a MIG UUID \(0: MIG-0-2, 0: MIG-0-4, 0: MIG-0-7\)"):
        _select.select_gpus(["MIG-nope"], three_orphans())


def test_memory_info_v1_gets_an_allowance_for_reserved_memory():
    """v1 `used` includes the reserved memory (529 MiB here): the default 256 MiB threshold works with the allowance,
    while memory beyond it (a context no process is listed for) still counts. The allowance is bounded by what real
    GPUs reserve (1 GiB): 3500 MiB leaked on an 80 GB GPU (v1 used 4029 MiB) is not idle."""
    view = view_of(
        [plain_gpu(0, 0, v1=True), plain_gpu(1, 8000, v1=True), plain_gpu(2, 0), plain_gpu(3, 3500, v1=True)],
        [cuda(20, [1])],
    )
    gpus = view["gpus"]
    assert [(g["memory_used_includes_reserved"], g["reserved_allowance_mib"], g["tolerance_mib"]) for g in gpus] == [
        (True, 1024, 1280),
        (True, 1024, 1280),
        (False, 0, 256),
        (True, 1024, 1280),
    ]
    assert [g["memory_unexplained"] for g in gpus] == [False, True, False, True]
    assert gpus[1]["holder_pids"] == [20]
    status = _release.gpu_status(_select.Selection(None, own_chain=OWN_CHAIN), view, 256)
    assert [(s["released"], bool(s["memory_note"])) for s in status] == [
        (True, True),
        (False, True),
        (True, False),
        (False, True),
    ]
    # 5% of a small GPU or MIG instance stays below the bound: 499 MiB of a 1g.10gb instance's 9984 MiB.
    v1 = {"source": "nvmlDeviceGetMemoryInfo"}
    assert [_holders.reserved_allowance(total, v1, {"driver_version": "580.95.05"}) for total in (9984, 143771)] == [
        499,
        1024,
    ]
    older = view_of([plain_gpu(0, 0, v1=True)], [], driver_version="470.82.01")
    assert (older["gpus"][0]["memory_used_includes_reserved"], older["gpus"][0]["reserved_allowance_mib"]) == (False, 0)


def test_cap_map_reads_mig_minors_and_agrees_with_the_fixed_numbering(tmp_path):
    caps_dir = tmp_path / "driver" / "nvidia-caps"
    caps_dir.mkdir(parents=True)
    (caps_dir / "mig-minors").write_text(
        "config 1\nmonitor 2\ngpu0/gi7/access 66\ngpu0/gi7/ci0/access 67\ngpu31/gi14/ci7/access 4322\n"
    )
    found = _procscan.cap_map(str(tmp_path))
    assert found == {66: (0, 7, None), 67: (0, 7, 0), 4322: (31, 14, 7)}
    assert all(_holders.mig_cap(minor) == granted for minor, granted in found.items())
    assert _holders.mig_cap(1) is None and _procscan.cap_map(str(tmp_path / "none")) is None


def test_scan_records_capability_files(tmp_path):
    pid_dir = tmp_path / "4242"
    (pid_dir / "fd").mkdir(parents=True)
    (pid_dir / "task" / "4242").mkdir(parents=True)
    (pid_dir / "maps").write_text("")
    for fd, target in enumerate(
        (
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia0",
            "/dev/nvidia-caps/nvidia-cap66",
            "/dev/nvidia-caps/nvidia-cap67",
        )
    ):
        (pid_dir / "fd" / str(fd)).symlink_to(target)
    handles = _procscan.scan_process(4242, str(tmp_path))
    assert (sorted(handles.caps), sorted(handles.minors)) == ([66, 67], [0])
    assert _procscan.DeviceHandles.from_dict(handles.as_dict()).caps == {66, 67}


def test_exited_creator_on_an_instance_is_held_by_the_cuda_user_with_that_instances_capabilities():
    """535.113.01+: the driver lists the dead creator's PID on instance 4 (its ids in the entry). The CUDA user holding
    instance 4's capability files holds that context; the one on instance 7 (nothing listed, 3000 MiB outside the
    lists: another namespace's or leaked) is a device user."""
    view = view_of(
        [mig_gpu(0, {4: 5000, 7: 3000}, processes=[(5000001, 5000, 4)])],
        [cuda(11, [0], cap_minors(0, 4)), cuda(12, [0], cap_minors(0, 7))],
        driver_version="580.95.05",
    )
    by_gi = instances(view)
    assert [e["pid"] for e in by_gi[4]["exited"]] == [5000001] and by_gi[4]["holder_pids"] == [11]
    assert by_gi[7]["holder_pids"] == [] and by_gi[7]["memory_unexplained"] is True
    (holder,) = view["holders"]
    assert holder["pid"] == 11 and holder["contexts_of"] == {"0": [5000001]} and holder["mig"] == {"0": ["MIG-0-4"]}
    assert [u["pid"] for u in view["device_users"]] == [12]
