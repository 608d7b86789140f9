# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_select: option checks, GPU selection, protection rules, the process chain, Selection.split and gpu_status.

Views are synthetic dicts shaped like _holders.merge's output (see its docstring), built by `make_view`.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _advice, _nothing, _proc, _release, _select

OWN_CHAIN = {1, 700, 701}
ME = pwd.getpwuid(os.getuid()).pw_name


@pytest.fixture(autouse=True)
def daemons(monkeypatch):
    """{PID: the protected executable it runs}: _select.daemon_name reads /proc/PID/exe, which these fake PIDs lack.
    Tests add entries; daemon_name itself is tested on a fake /proc below."""
    running = {5000003: "nvidia-persistenced", 5000011: "nvidia-persistenced"}
    monkeypatch.setattr(_select, "daemon_name", lambda pid, start_ticks, proc="/proc", owner=0: running.get(pid))
    return running


def holder(
    pid=5000001,
    memory=None,
    comm=None,
    cmdline="python3 -m vllm.entrypoints.openai.api_server",
    user="svc-llm",
    uid=1001,
    state="S",
    ppid=4000,
    attribution=None,
    control_only=False,
    kernel_thread=False,
):
    """A holder as merge reports it: `memory` maps each GPU index it holds to its MiB (None: not reported);
    `attribution` maps indices to "device_file" where it holds by the device file alone (default "driver")."""
    memory = {0: 70000} if memory is None else memory
    attribution = attribution or {}
    gpus = sorted(memory)
    return {
        "pid": pid,
        "ppid": ppid,
        "pgid": pid,
        "sid": pid,
        "comm": comm or (cmdline.split(" ")[0][:15] or "python3"),
        "state": state,
        "start_ticks": pid * 10,
        "kernel_thread": kernel_thread,
        "user": user,
        "uid": uid,
        "cmdline": cmdline,
        "start_time": "2026-01-01T00:00:00+00:00",
        "gpus": gpus,
        "device_gpus": [] if control_only else gpus,
        "minors": [] if control_only else gpus,
        "memory_mib": {str(i): memory[i] for i in gpus},
        "attribution": {str(i): attribution.get(i, "driver") for i in gpus},
        "seen_in": ["driver"] if control_only else ["driver", "fd", "mapping"],
        "kind": "cuda",
        "control_only": control_only,
        "thread_only": False,
        "parent": {"pid": ppid, "comm": "bash"} if ppid > 1 else None,
    }


def device_user(pid, device_gpus, kind="nvml", comm="dcgm-exporter", cmdline="/usr/bin/dcgm-exporter"):
    """A process with device files open and no memory: never a holder."""
    return {
        "pid": pid,
        "ppid": 1,
        "comm": comm,
        "state": "S",
        "start_ticks": pid * 10,
        "kernel_thread": False,
        "user": "root",
        "uid": 0,
        "cmdline": cmdline,
        "device_gpus": list(device_gpus),
        "minors": list(device_gpus),
        "kind": kind,
        "seen_in": ["fd"],
        "thread_only": False,
    }


def gpu(index, used_mib=3, foreign=(), suspects=(), error=None, tolerance_mib=256):
    """One GPU entry; `foreign`: [(pid, MiB, reason)]. Listed/unexplained memory is filled in by make_view."""
    return {
        "index": index,
        "minor": index,
        "uuid": "GPU-%d" % index,
        "name": "NVIDIA H100 80GB HBM3",
        "pci_bus_id": "00000000:%02X:00.0" % (0x18 + index),
        "memory_total_mib": 81559,
        "memory_used_mib": used_mib,
        "memory_free_mib": None if used_mib is None else 81559 - 529 - used_mib,
        "memory_reserved_mib": None if used_mib is None else 529,
        "memory_source": "v2",
        "error": error,
        "foreign": [
            {"pid": pid, "used_mib": mib, "type": "compute", "reason": reason, "comm": None}
            for pid, mib, reason in foreign
        ],
        "suspects": list(suspects),
        "tolerance_mib": tolerance_mib,
    }


def make_view(gpus, holders=(), device_users=(), driver=None):
    """merge()'s dict: driver_processes, explained/unexplained memory and the PID lists follow from the holders."""
    out = []
    for entry in gpus:
        entry = dict(entry)
        key = str(entry["index"])
        listed = [
            {
                "pid": h["pid"],
                "used_mib": h["memory_mib"][key],
                "type": "mps" if h["control_only"] else "compute",
                "verified": True,
            }
            for h in holders
            if h["attribution"].get(key) == "driver"
        ]
        listed += [
            {"pid": f["pid"], "used_mib": f["used_mib"], "type": f["type"], "verified": False} for f in entry["foreign"]
        ]
        explained = sum(item["used_mib"] or 0 for item in listed)
        used = entry["memory_used_mib"]
        unexplained = None if used is None else max(0, used - explained)
        entry.update(
            driver_processes=listed,
            explained_mib=explained,
            unexplained_mib=unexplained,
            memory_unexplained=unexplained is None or unexplained > entry["tolerance_mib"],
            holder_pids=[h["pid"] for h in holders if entry["index"] in h["gpus"]],
            device_user_pids=[u["pid"] for u in device_users if entry["index"] in u["device_gpus"]],
        )
        out.append(entry)
    return {
        "gpus": out,
        "holders": list(holders),
        "device_users": list(device_users),
        "unmapped_minors": [],
        "driver": dict(driver or {"available": True, "error": None, "timed_out": False}),
    }


VIEW = make_view([gpu(0), gpu(1), gpu(2)])


# --- empty options, GPU selection ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "requested, expected",
    [([0, 2], [0, 2]), (["2", " 1 "], [1, 2]), (["GPU-2", 0], [0, 2]), ([1, "1", "GPU-1"], [1]), (None, None)],
)
def test_select_gpus(requested, expected):
    assert _select.select_gpus(requested, VIEW) == expected


@pytest.mark.parametrize(
    "requested", [[3], ["GPU-3"], [0, -1], ["0x1"], [True], [False], ["١"], ["1١"], [1.0], ["", 1]]
)
def test_select_gpus_unknown_lists_the_known_ones(requested):
    with pytest.raises(_select.SelectionError) as info:
        _select.select_gpus(requested, VIEW)
    message = str(info.value)
    assert "unknown GPU" in message and "give a GPU by its index (this host has 0, 1, 2)" in message
    assert "its UUID (0: GPU-0, 1: GPU-1, 2: GPU-2) or a MIG UUID (none known)" in message


def test_select_gpus_unknown_names_each_uuid_with_its_index():
    # UUIDs that sort otherwise than their GPUs' indices; GPU 1 split into MIG instances.
    view = make_view([gpu(0), gpu(1), gpu(2)])
    for entry, uuid in zip(view["gpus"], ("GPU-5ae9", "GPU-1f12", "GPU-20dd")):
        entry["uuid"] = uuid
    view["gpus"][1]["mig_devices"] = [{"uuid": "MIG-b"}, {"uuid": "MIG-a"}]
    with pytest.raises(_select.SelectionError) as info:
        _select.select_gpus([7], view)
    assert str(info.value) == (
        "unknown GPU 7: give a GPU by its index (this host has 0, 1, 2), its UUID (0: GPU-5ae9, 1: GPU-1f12, "
        "2: GPU-20dd) or a MIG UUID (1: MIG-a, 1: MIG-b)"
    )


@pytest.mark.parametrize("requested", [["[2]"], ["[0", "2]"]])
def test_select_gpus_says_how_to_write_a_list_that_key_value_arguments_passed_as_text(requested):
    with pytest.raises(_select.SelectionError) as info:
        _select.select_gpus(requested, VIEW)
    message = str(info.value)
    assert message.startswith("unknown GPU %r" % requested[0]) and "write gpus=0,1 there" in message
    assert """-a '{"gpus": [0, 1]}'""" in message


def test_select_gpus_unknown_without_brackets_gives_no_list_hint():
    with pytest.raises(_select.SelectionError) as info:
        _select.select_gpus(["GPU-3"], VIEW)
    assert "key=value" not in str(info.value)


def test_select_gpus_refuses_an_empty_list():
    # An empty list used to mean "all GPUs": a templated list that came out empty must not end a whole node.
    with pytest.raises(_select.SelectionError, match="gpus is empty"):
        _select.select_gpus([], VIEW)


def test_select_gpus_without_map():
    no_nvml = {
        "available": False,
        "error": "NVMLError_LibraryNotFound: NVML Shared Library Not Found",
        "timed_out": False,
    }
    assert _select.select_gpus(None, make_view([], driver=no_nvml)) is None
    with pytest.raises(_select.SelectionError) as info:
        _select.select_gpus([0], make_view([], driver=no_nvml))
    assert "/proc/driver/nvidia" in str(info.value) and "NVML Shared Library Not Found" in str(info.value)
    hung = {"available": False, "error": "an NVML call did not return within 10.0 s", "timed_out": True}
    with pytest.raises(_select.SelectionError) as info:
        _select.select_gpus([0], make_view([], driver=hung))
    assert "NVML did not answer" in str(info.value) and "Xid" in str(info.value)
    assert str(info.value).count("NVML did not answer") == 1 and "did not return" not in str(info.value)


def test_check_not_empty():
    _select.check_not_empty(gpus=None, pids=None, match=None, users=[0])
    with pytest.raises(_select.SelectionError) as info:
        _select.check_not_empty(users=[], gpus=None)
    assert str(info.value).startswith("users is empty: ") and "omit the option" in str(info.value)
    with pytest.raises(_select.SelectionError, match=r"^gpus, match, pids are empty: "):
        _select.check_not_empty(pids=[], match="", gpus=[])


def test_compile_match():
    assert _select.compile_match(None) is None
    assert _select.compile_match("VLLM::|vllm serve").search("VLLM::Worker_TP0")
    with pytest.raises(_select.SelectionError, match=r"invalid regex in match 'VLLM::\(': missing \)"):
        _select.compile_match("VLLM::(")
    with pytest.raises(_select.SelectionError, match="match is empty"):
        _select.compile_match("")


def test_check_users():
    assert _select.check_users(None) is None
    assert _select.check_users([ME, "1001", "0"]) == {ME, "1001", "0"}  # numeric UIDs need no passwd entry
    with pytest.raises(_select.SelectionError) as info:
        _select.check_users([ME, "no-such-user-gpuops", "١٠٠١"])  # non-ASCII digits are a name, not a UID
    assert str(info.value).startswith("no such user on this host: no-such-user-gpuops, ١٠٠١")
    with pytest.raises(_select.SelectionError, match="users is empty"):
        _select.check_users([])


def test_check_pids():
    assert _select.check_pids(None) is None
    assert _select.check_pids([5000001, 1, 5000001]) == {1, 5000001}
    with pytest.raises(_select.SelectionError, match=r"pids must be positive process IDs, got 0, -3$"):
        _select.check_pids([7, 0, -3])
    with pytest.raises(_select.SelectionError, match=r"got True$"):  # YAML true passes Ansible's int check as 1
        _select.check_pids([True])
    with pytest.raises(_select.SelectionError, match="pids is empty"):
        _select.check_pids([])


@pytest.mark.parametrize(
    "params, message",
    [
        ({"gpus": []}, "gpus is empty"),
        ({"pids": [0]}, "pids must be positive"),
        ({"match": "("}, "invalid regex"),
        ({"match": ""}, "match is empty"),
        ({"users": ["no-such-user-gpuops"]}, "no such user"),
        ({"users": []}, "users is empty"),
    ],
)
def test_check_options_refuses_bad_input_without_a_view(params, message):
    with pytest.raises(_select.SelectionError, match=message):
        _select.check_options(params)


def test_check_options_accepts_omitted_options_and_leaves_gpu_indices_to_the_view():
    nothing = _select.check_options({})
    assert (nothing.gpus, nothing.pids, nothing.regex, nothing.users, nothing.exclude) == (None, None, None, None, ())
    some = _select.check_options({"gpus": ["7"], "pids": [5], "match": "x", "users": [ME], "exclude": []})
    assert (some.gpus, some.pids, some.regex.pattern, some.users) == (["7"], {5}, "x", {ME})


# --- protection, the process chain ---------------------------------------------------------------------------------


def test_protection_never_pid_1_own_chain_or_kernel_threads():
    assert _select.protection(holder(pid=1, ppid=0), OWN_CHAIN, include_protected=True) == "PID 1 (init)"
    assert "ancestors" in _select.protection(holder(pid=701), OWN_CHAIN, include_protected=True)
    assert (
        _select.protection(
            holder(pid=300, ppid=2, comm="kworker/0:1", cmdline="", kernel_thread=True),
            OWN_CHAIN,
            include_protected=True,
        )
        == "kernel thread"
    )
    # Inside a node's PID namespace PID 2 is an ordinary process: its children are not kernel threads.
    assert _select.protection(holder(pid=300, ppid=2), OWN_CHAIN) is None
    assert _select.protection(holder(), OWN_CHAIN) is None


@pytest.mark.parametrize("name", _select.PROTECTED_NAMES)
def test_each_gpu_daemon_is_protected_by_its_executable(daemons, name):
    daemons[5000050] = name
    entry = holder(pid=5000050, comm="daemon", cmdline="daemon")
    assert _select.protection(entry, OWN_CHAIN) == "protected GPU daemon (%s)" % name
    assert _select.protection(entry, OWN_CHAIN, include_protected=True) is None


@pytest.mark.parametrize("name", _select.PROTECTED_NAMES)
def test_a_daemon_s_name_as_title_protects_nothing(name):
    """Issue 33 item 2: any user can run `exec -a nvidia-persistenced python3 ...` (argv[0]) or set comm (prctl,
    setproctitle): a name is not an identity. Only the executable counts."""
    for entry in (
        holder(comm=name[:15], cmdline=""),
        holder(comm="python3", cmdline="%s --verbose" % name),
        holder(comm=name[:15], cmdline="/usr/bin/%s" % name),
        holder(cmdline="python3 watch.py %s" % name),
    ):
        assert _select.protection(entry, OWN_CHAIN) is None, entry


def test_exclude_holds_even_with_include_protected():
    entry = holder(comm="VLLM::EngineCor", cmdline="VLLM::EngineCore")
    assert _select.protection(entry, OWN_CHAIN, exclude=["VLLM::EngineCor"]).startswith(
        "excluded by the exclude option"
    )
    assert _select.protection(entry, OWN_CHAIN, exclude=["VLLM::EngineCore"], include_protected=True).startswith(
        "excluded by the exclude option"
    )
    assert _select.protection(entry, OWN_CHAIN, exclude=["VLLM::Worker"]) is None
    assert _select.protection(entry, OWN_CHAIN, exclude=[""]) is None  # an empty name matches nothing


def test_include_protected_never_lifts_pid_1_or_own_chain():
    assert (
        _select.protection(holder(pid=1, comm="nvidia-persistenced"), OWN_CHAIN, include_protected=True)
        == "PID 1 (init)"
    )
    assert _select.protection(
        holder(pid=700, comm="nvidia-persistenced"), OWN_CHAIN, include_protected=True
    ).startswith("this module")


def test_ancestors_of_this_process():
    chain = _select.ancestors()
    assert os.getpid() in chain and os.getppid() in chain
    assert 1 in chain


def test_ancestors_in_a_fake_proc_with_a_tricky_comm(tmp_path):
    for pid, ppid, comm in ((1, 0, "init"), (40, 1, "sshd: root (priv)"), (41, 40, "a) b"), (42, 41, "python3")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(
            "%d (%s) S %d %d %d 0 -1 4194560 %s\n"
            % (pid, comm, ppid, pid, pid, " ".join(str(n) for n in range(100, 130)))
        )
    assert _select.ancestors(42, str(tmp_path)) == {42, 41, 40, 1}
    assert _select.ancestors(99, str(tmp_path)) == {99}  # gone: only itself


# --- Selection: targets, left alone, not holding -------------------------------------------------------------------

ENGINE = holder(5000001, {0: 70000, 1: 500}, cmdline="VLLM::EngineCore")
WORKER = holder(5000002, {1: 60000}, cmdline="VLLM::Worker_TP1", user="root", uid=0)
PERSISTENCED = holder(
    5000003, {0: 0, 1: 0}, comm="nvidia-persiste", cmdline="/usr/bin/nvidia-persistenced --verbose", user="root", uid=0
)
MPS_CLIENT = holder(5000004, {2: 1200}, cmdline="python3 mps_job.py", control_only=True)
EXPORTER = device_user(5000005, [0, 1, 2])
NCCL_PEER = device_user(5000006, [0, 1, 2], kind="cuda", comm="VLLM::Worker_TP", cmdline="VLLM::Worker_TP0")
FULL = make_view(
    [gpu(0, 70003), gpu(1, 60503), gpu(2, 1203)], [ENGINE, WORKER, PERSISTENCED, MPS_CLIENT], [EXPORTER, NCCL_PEER]
)


def selection(indices=None, **kwargs):
    return _select.Selection(indices, own_chain=OWN_CHAIN, **kwargs)


def pids(entries):
    return [e["pid"] for e in entries]


def test_all_gpus_select_every_unprotected_holder_and_mps_clients_but_never_device_users():
    split = selection().split(FULL)
    assert pids(split["targets"]) == [5000001, 5000002, 5000004]
    assert pids(split["left_alone"]) == [5000003] and split["left_alone"][0]["reason"].startswith(
        "protected GPU daemon"
    )
    assert split["not_holding"] == []
    assert split["targets"][0] is ENGINE  # holders are passed through unchanged


def test_specific_gpus_select_their_holders_only():
    split = selection([0]).split(FULL)
    assert pids(split["targets"]) == [5000001] and pids(split["left_alone"]) == [5000003]
    # The MPS client is listed by the driver on GPU 2: selected there, like any holder.
    assert pids(selection([2]).split(FULL)["targets"]) == [5000004]


def test_device_users_named_in_pids_hold_nothing():
    split = selection(pids={5000005, 5000006, 5000001}).split(FULL)
    assert pids(split["targets"]) == [5000001]
    assert split["not_holding"] == [5000005, 5000006]
    assert {h["pid"] for h in split["left_alone"]} == {5000002, 5000003, 5000004}


def test_pids_filter_and_not_holding():
    split = selection([0], pids={5000002, 5000001, 4242}).split(FULL)
    assert pids(split["targets"]) == [5000001]
    assert split["not_holding"] == [4242, 5000002]  # 5000002 holds GPU 1 only
    assert [(h["pid"], h["reason"]) for h in split["left_alone"]] == [(5000003, "not in pids")]


def test_match_filters_on_the_full_command_line():
    split = selection(regex=_select.compile_match(r"VLLM::Worker_TP\d")).split(FULL)
    assert pids(split["targets"]) == [5000002]
    reasons = {h["pid"]: h["reason"] for h in split["left_alone"]}
    assert reasons[5000001] == "command line does not match 'VLLM::Worker_TP\\\\d'"


def test_users_by_name_or_uid():
    assert pids(selection(users={"root"}).split(FULL)["targets"]) == [5000002]
    split = selection(users={"1001"}).split(FULL)
    assert pids(split["targets"]) == [5000001, 5000004]
    assert {h["pid"]: h["reason"] for h in split["left_alone"]}[5000002] == "user root not in users"


def test_exclude_and_include_protected():
    split = selection(exclude=["VLLM::EngineCore"], include_protected=True).split(FULL)
    assert pids(split["targets"]) == [5000002, 5000003, 5000004]
    assert pids(split["left_alone"]) == [5000001] and split["left_alone"][0]["reason"].startswith("excluded")


def test_own_chain_is_protected_even_when_selected_by_pid():
    mine = holder(700, {0: 300}, cmdline="ansible-playbook site.yml")
    split = selection(pids={700}, include_protected=True).split(make_view([gpu(0, 303)], [mine]))
    assert split["targets"] == [] and pids(split["left_alone"]) == [700] and split["not_holding"] == []
    assert "ancestors" in split["left_alone"][0]["reason"]


def test_narrowed():
    assert selection([0]).narrowed is False
    assert selection(exclude=["x"], include_protected=True).narrowed is False
    assert selection(pids={5}).narrowed and selection(users={"root"}).narrowed
    assert selection(regex=_select.compile_match("x")).narrowed


def test_from_params_checks_and_builds_the_selection():
    chosen = _select.Selection.from_params(
        {
            "gpus": ["GPU-1"],
            "pids": [5000002],
            "match": "VLLM",
            "users": ["0"],
            "exclude": ["foo"],
            "include_protected": True,
        },
        FULL,
    )
    assert chosen.indices == [1] and chosen.pids == {5000002} and chosen.regex.pattern == "VLLM"
    assert chosen.users == {"0"} and chosen.exclude == ("foo",) and chosen.include_protected is True
    assert os.getpid() in chosen.own_chain
    assert pids(chosen.split(FULL)["targets"]) == [5000002]
    # Missing keys mean "any".
    anything = _select.Selection.from_params({}, FULL)
    assert (
        anything.indices,
        anything.pids,
        anything.regex,
        anything.users,
        anything.exclude,
        anything.include_protected,
    ) == (None, None, None, None, (), False)


@pytest.mark.parametrize(
    "params, message",
    [
        ({"gpus": [3]}, "unknown GPU 3"),
        ({"gpus": []}, "gpus is empty"),
        ({"pids": []}, "pids is empty"),
        ({"pids": [-1]}, "pids must be positive"),
        ({"match": ""}, "match is empty"),
        ({"users": []}, "users is empty"),
        ({"users": ["no-such-user-gpuops"]}, "no such user"),
    ],
)
def test_from_params_refuses(params, message):
    with pytest.raises(_select.SelectionError, match=message):
        _select.Selection.from_params(params, FULL)


# --- gpu_status: when a GPU is released ------------------------------------------------------------------------------


def status(chosen, view, max_used_mib=256):
    return {g["index"]: g for g in _release.gpu_status(chosen, view, max_used_mib)}


def test_gpu_status_reports_targets_briefly_with_memory_attribution_and_parent():
    by_index = status(selection(), FULL)
    assert sorted(by_index) == [0, 1, 2] and not any(g["released"] for g in by_index.values())
    assert by_index[0]["holders"] == [
        {
            "pid": 5000001,
            "comm": "VLLM::EngineCor",
            "state": "S",
            "cmdline": "VLLM::EngineCore",
            "user": "svc-llm",
            "memory_mib": 70000,
            "attribution": "driver",
            "parent": {"pid": 4000, "comm": "bash"},
        }
    ]
    assert [(h["pid"], h["memory_mib"]) for h in by_index[1]["holders"]] == [(5000001, 500), (5000002, 60000)]
    assert [h["pid"] for h in by_index[2]["holders"]] == [5000004]  # the MPS client
    assert [(h["pid"], h["reason"][:20]) for h in by_index[0]["left_alone"]] == [(5000003, "protected GPU daemon")]
    assert by_index[0]["memory_checked"] is True and by_index[0]["memory_used_mib"] == 70003
    assert by_index[0]["memory_reserved_mib"] == 529 and by_index[0]["uuid"] == "GPU-0"


def test_a_whole_mig_gpu_that_is_not_free_names_its_instances_in_use():
    engine = holder(5000001, {0: 30000})
    view = make_view([gpu(0, 30300), gpu(1, 3)], [engine])
    view["gpus"][0]["mig_devices"] = [
        {"uuid": "MIG-a", "profile": "3g.40gb", "memory_used_mib": 30000, "holder_pids": [5000001]},
        {"uuid": "MIG-b", "profile": "2g.20gb", "memory_used_mib": 300, "holder_pids": []},
        {"uuid": "MIG-c", "profile": "1g.10gb", "memory_used_mib": 0, "holder_pids": []},
        {"uuid": "MIG-e", "profile": "1g.10gb", "memory_used_mib": None, "holder_pids": [5000009]},
    ]
    view["gpus"][1]["mig_devices"] = [{"uuid": "MIG-d", "profile": "7g.80gb", "memory_used_mib": 0, "holder_pids": []}]
    by_index = status(selection(), view)
    assert by_index[0]["mig_in_use"] == [
        {"uuid": "MIG-a", "profile": "3g.40gb", "memory_used_mib": 30000, "holder_pids": [5000001]},
        {"uuid": "MIG-b", "profile": "2g.20gb", "memory_used_mib": 300, "holder_pids": []},
        {"uuid": "MIG-e", "profile": "1g.10gb", "memory_used_mib": None, "holder_pids": [5000009]},
    ]
    assert by_index[1]["released"] is True and "mig_in_use" not in by_index[1]
    entry = dict(by_index[0], next_step="end them")
    assert _advice.describe(entry).endswith(
        "MIG instances in use: GPU 0 MIG instance MIG-a (3g.40gb): 30000 MiB used, held by PID 5000001; GPU 0 MIG "
        "instance MIG-b (2g.20gb): 300 MiB used, no holder found; GPU 0 MIG instance MIG-e (1g.10gb): memory unknown, held by "
        "PID 5000009; next: end them"
    )


def test_gpu_status_only_covers_the_selected_gpus():
    assert [g["index"] for g in _release.gpu_status(selection([2, 0]), FULL, 256)] == [0, 2]


def test_device_users_never_make_a_gpu_not_free():
    view = make_view([gpu(0, 3), gpu(1, 3)], device_users=[EXPORTER, NCCL_PEER])
    by_index = status(selection(), view)
    assert all(g["released"] and g["holders"] == [] and g["left_alone"] == [] for g in by_index.values())


def test_threshold_is_inclusive():
    assert status(selection(), make_view([gpu(0, 256)]))[0]["released"] is True
    assert status(selection(), make_view([gpu(0, 257)]))[0]["released"] is False
    assert status(selection(), make_view([gpu(0, 257)]), max_used_mib=300)[0]["released"] is True


def test_left_alone_holders_memory_is_subtracted():
    # The engine is left alone (not in pids): its 70000 MiB do not keep GPU 0 busy; the worker's GPU 1 is busy.
    view = make_view([gpu(0, 70003), gpu(1, 60003)], [holder(5000001, {0: 70000}), holder(5000002, {1: 60000})])
    by_index = status(selection(pids={5000002}), view)
    assert by_index[0]["released"] is True and by_index[0]["left_alone_mib"] == 70000 and by_index[0]["holders"] == []
    assert [(h["pid"], h["reason"], h["memory_mib"]) for h in by_index[0]["left_alone"]] == [
        (5000001, "not in pids", 70000)
    ]
    assert by_index[1]["released"] is False and by_index[1]["left_alone_mib"] == 0
    # Only what the left-alone holders hold is subtracted: 400 MiB more than that is "not free".
    view = make_view([gpu(0, 70400)], [holder(5000001, {0: 70000})])
    assert status(selection(pids={5000002}), view)[0]["released"] is False


def test_left_alone_device_file_holder_takes_the_unexplained_memory():
    # A device-file holder (inherited handle after the creator's exit) holds the memory no list explains.
    orphan = holder(5000007, {0: None}, attribution={0: "device_file"}, cmdline="python3 child.py")
    view = make_view([gpu(0, 30000)], [orphan])
    by_index = status(selection(exclude=["python3"]), view)
    assert by_index[0]["left_alone_mib"] == 30000 and by_index[0]["unexplained_mib"] == 30000
    assert by_index[0]["left_alone"][0]["attribution"] == "device_file" and by_index[0]["released"] is True
    target = status(selection(), view)[0]
    assert target["released"] is False and target["holders"][0]["memory_mib"] is None


def test_foreign_memory_counts_as_used_and_is_reported():
    view = make_view([gpu(0, 40003, foreign=[(812345, 40000, "absent")])])
    (entry,) = _release.gpu_status(selection(), view, 256)
    assert entry["released"] is False and entry["holders"] == [] and entry["unexplained_mib"] == 3
    assert entry["foreign"] == [{"pid": 812345, "used_mib": 40000, "type": "compute", "reason": "absent", "comm": None}]


def test_gpu_with_an_error_is_never_released():
    view = make_view([gpu(0, None, error="Unknown Error"), gpu(1, 3)])
    by_index = status(selection(), view)
    assert by_index[0]["released"] is False and by_index[0]["error"] == "Unknown Error"
    assert by_index[0]["memory_checked"] is False and by_index[1]["released"] is True


def test_unchecked_memory_releases_on_holders_alone():
    (entry,) = _release.gpu_status(selection(), make_view([gpu(0, None)]), 256)
    assert entry["released"] is True and entry["memory_checked"] is False
    (entry,) = _release.gpu_status(selection(), make_view([gpu(0, None)], [holder(5000001, {0: None})]), 256)
    assert entry["released"] is False


def test_without_any_map_there_is_one_entry_for_all_gpus():
    # No NVML, no /proc/driver/nvidia: merge makes CUDA users of any device file holders of "a GPU" (gpus []).
    stray = holder(5000001, {}, cmdline="python3 train.py")
    daemon = holder(5000003, {}, comm="nvidia-persiste", cmdline="/usr/bin/nvidia-persistenced")
    no_driver = {"available": False, "error": "NVMLError_LibraryNotFound", "timed_out": False}
    (entry,) = _release.gpu_status(selection(), make_view([], [stray, daemon], [EXPORTER], driver=no_driver), 256)
    assert entry["index"] is None and entry["released"] is False and entry["memory_checked"] is False
    assert entry["holders"] == [
        {
            "pid": 5000001,
            "comm": "python3",
            "state": "S",
            "cmdline": "python3 train.py",
            "user": "svc-llm",
            "memory_mib": None,
            "attribution": None,
            "parent": {"pid": 4000, "comm": "bash"},
        }
    ]
    assert [(h["pid"], h["reason"][:20]) for h in entry["left_alone"]] == [(5000003, "protected GPU daemon")]
    (entry,) = _release.gpu_status(selection(), make_view([], [daemon], [EXPORTER], driver=no_driver), 256)
    assert entry == {
        "index": None,
        "uuid": None,
        "memory_used_mib": None,
        "memory_reserved_mib": None,
        "unexplained_mib": None,
        "memory_unexplained": None,
        "unexplained_cause": None,
        "holders": [],
        "left_alone": [dict(_release.brief(daemon, None), reason=entry["left_alone"][0]["reason"], counted=True)],
        "left_alone_mib": 0,
        "protected_mib": 0,
        "foreign": [],
        "exited": [],
        "kept": None,
        "suspects": [],
        "memory_checked": False,
        "error": None,
        "mig_uuid": None,
        "reserved_allowance_mib": 0,
        "memory_note": None,
        "released": True,
    }


def test_brief():
    assert _release.brief(ENGINE, 1) == {
        "pid": 5000001,
        "comm": "VLLM::EngineCor",
        "state": "S",
        "cmdline": "VLLM::EngineCore",
        "user": "svc-llm",
        "memory_mib": 500,
        "attribution": "driver",
        "parent": {"pid": 4000, "comm": "bash"},
    }
    assert _release.brief(ENGINE, 2)["memory_mib"] is None and _release.brief(ENGINE, None)["attribution"] is None


def test_split_tells_protection_from_narrowing():
    """gpu_kill's `protected` lists the holders the protection rules or `exclude` leave alone; those that pids, match,
    users or an owner filter leave alone are in `left_alone` only."""
    unit = dict(holder(5000010, {0: 1000}), owner={"systemd_unit": "other.service"})
    daemon = holder(5000011, {0: 10}, cmdline="/usr/bin/nvidia-persistenced", comm="nvidia-persiste")
    target = dict(holder(5000012, {0: 2000}), owner={"systemd_unit": "vllm@a.service"})
    view = make_view([gpu(0)], [unit, daemon, target])
    split = _select.Selection(None, own_chain=OWN_CHAIN, owners={"units": ["vllm@a"]}).split(view)
    assert [h["pid"] for h in split["targets"]] == [5000012]
    assert {h["pid"]: h["reason"] for h in split["left_alone"]} == {
        5000010: "unit not in units",
        5000011: "unit not in units",
    }
    split = _select.Selection(None, own_chain=OWN_CHAIN).split(view)
    assert [h["pid"] for h in split["protected"]] == [5000011]
    assert split["protected"][0]["reason"] == "protected GPU daemon (nvidia-persistenced)"
    split = _select.Selection(None, own_chain=OWN_CHAIN, regex=re.compile("vllm")).split(view)
    assert split["protected"] == [] and len(split["left_alone"]) == 1


@pytest.mark.parametrize(
    "given, message",
    [
        ({"gpus": None}, "gpus is null"),
        ({"pids": None, "users": None}, "pids, users are null"),
        ({"match": " \t"}, "match is blank"),
        ({"units": [None, " "]}, "units is a list of nothing but null or blank entries"),
    ],
)
def test_check_options_refuses_a_given_option_that_names_nothing(given, message):
    params = dict({name: None for name in _nothing.SELECTION_OPTIONS}, **given)
    with pytest.raises(_select.SelectionError) as info:
        _select.check_options(params, given=given)
    assert str(info.value).startswith(message + ": a selection that names nothing is refused")


def test_check_options_takes_none_as_left_out_without_the_given_arguments():
    assert _select.check_options({"gpus": None, "pids": None}).gpus is None
    assert _select.check_options({"gpus": None}, given={"max_used_mib": 5}).gpus is None


# --- protected by what they are (issue 33 item 2) --------------------------------------------------------------------

DAEMON_NAME = _select.daemon_name  # the real one: the autouse fixture replaces the module's


def fake_process(tmp_path, pid, executable, mode=0o755, ticks=None):
    """A fake /proc entry of `pid` whose exe links to a file `executable` (a path under tmp_path) with `mode`."""
    path = tmp_path / executable.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("binary")
    path.chmod(mode)
    entry = tmp_path / "proc" / str(pid)
    entry.mkdir(parents=True)
    (entry / "exe").symlink_to(path)
    fields = ["S", "1", str(pid), str(pid)] + ["0"] * 15 + [str(ticks or pid * 10)] + ["0"] * 30
    (entry / "stat").write_text("%d (x) %s\n" % (pid, " ".join(fields)))
    return str(tmp_path / "proc")


def test_daemon_name_is_the_executable_that_only_root_could_have_put_there(tmp_path):
    me = os.geteuid()  # the owner these files have; on a host, root (0)
    proc = fake_process(tmp_path, 11, "/usr/bin/nvidia-persistenced")
    assert DAEMON_NAME(11, 110, proc, owner=me) == "nvidia-persistenced"
    assert DAEMON_NAME(11, 110, proc, owner=me + 1) is None  # a user's copy of a binary, renamed
    assert DAEMON_NAME(11, 999, proc, owner=me) is None  # the PID names another process now
    assert DAEMON_NAME(12, 120, proc, owner=me) is None  # gone
    for pid, mode in ((13, 0o775), (14, 0o757)):  # writable by others: anyone could have written it
        proc = fake_process(tmp_path, pid, "/opt/w%d/nvidia-persistenced" % pid, mode=mode)
        assert DAEMON_NAME(pid, pid * 10, proc, owner=me) is None
    proc = fake_process(tmp_path, 15, "/usr/bin/python3.12")  # exec -a nvidia-persistenced python3: exe is python3
    assert DAEMON_NAME(15, 150, proc, owner=me) is None
    # Replaced by a package upgrade while it runs: the kernel adds " (deleted)" to the link.
    proc = fake_process(tmp_path, 16, "/usr/lib/xorg/Xorg (deleted)")
    assert DAEMON_NAME(16, 160, proc, owner=me) == "Xorg"


def test_daemon_name_of_real_processes(spawn, tmp_path):
    """A real process started from a root-owned binary named nvidia-cuda-mps-server is that daemon; python3 started
    with argv[0] and comm set to nvidia-persistenced (exec -a, prctl) is not."""
    binary = tmp_path / "bin" / "nvidia-cuda-mps-server"
    binary.parent.mkdir()
    shutil.copy(os.path.realpath(sys.executable), binary)
    binary.chmod(0o755)
    code = "import ctypes, time\nctypes.CDLL(None).prctl(15, b'nvidia-persistenced')\nprint('ready', flush=True)\ntime.sleep(60)\n"
    daemon = spawn([str(binary), "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    titled = spawn(
        ["nvidia-persistenced", "-c", code], executable=sys.executable, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    for child in (daemon, titled):
        assert child.stdout.readline().strip() == b"ready", child.stdout.read()
    me = os.geteuid()
    assert DAEMON_NAME(daemon.pid, _proc.read_start_ticks(daemon.pid), owner=me) == "nvidia-cuda-mps-server"
    assert _proc.read_stat(titled.pid)["comm"] == "nvidia-persiste" and _proc.read_argv(titled.pid)[0] == (
        "nvidia-persistenced"
    )
    assert DAEMON_NAME(titled.pid, _proc.read_start_ticks(titled.pid), owner=me) is None


def test_a_protected_holder_s_memory_keeps_the_gpu_from_being_free(daemons):
    """Issue 33 item 2: a left-alone protected holder's memory is not subtracted as harmless. What the operator
    leaves out (pids, match, users, owner filters, exclude) is."""
    daemon = holder(5000003, {0: 40000}, comm="nvidia-persiste", cmdline="/usr/bin/nvidia-persistenced")
    view = make_view([gpu(0, 40003)], [daemon])
    (entry,) = _release.gpu_status(selection(), view, 256)
    assert entry["released"] is False and entry["holders"] == []
    assert (entry["protected_mib"], entry["left_alone_mib"]) == (40000, 0)
    assert entry["left_alone"][0]["counted"] is True and _release.held_by_protected(entry, 256) is True
    step = _advice.next_step(entry)
    assert step.startswith("PID 5000003 (nvidia-persiste, 40000 MiB) holds its memory and is left alone by default")
    assert "include_protected=true" in step and "exclude" in step
    assert "40000 MiB of it by protected holders, which counts" in _advice.describe(dict(entry, next_step=step))
    # Left out by the operator's choice: subtracted, and named.
    (entry,) = _release.gpu_status(selection(exclude=["nvidia-persistenced"]), view, 256)
    assert entry["released"] is True and (entry["protected_mib"], entry["left_alone_mib"]) == (0, 40000)
    assert entry["left_alone"][0]["counted"] is False
    # A protected holder with little memory (an MPS server's context, a persistence daemon) leaves the GPU free.
    small = make_view([gpu(0, 35)], [dict(daemon, memory_mib={"0": 32})])
    (entry,) = _release.gpu_status(selection(), small, 256)
    assert entry["released"] is True and entry["protected_mib"] == 32
    # Memory still being released besides the daemon's: not yet a matter of the daemon alone.
    (entry,) = _release.gpu_status(selection(), make_view([gpu(0, 70000)], [daemon]), 256)
    assert entry["released"] is False and _release.held_by_protected(entry, 256) is False


# --- one classification of a selection that names nothing (issue 34 item 3) -----------------------------------------


@pytest.mark.parametrize(
    "value, kind",
    [
        (None, "null"),
        ("", "empty"),
        (" \t", "blank"),
        ([], "empty"),
        ((), "empty"),
        ([None, " "], "only blank entries"),
        ([0, ""], "a blank entry"),
        ([0], None),
        ("vllm", None),
        (0, None),
        ({}, None),
    ],
)
def test_names_nothing_is_the_one_classification(value, kind):
    assert _nothing.names_nothing(value) == kind


def test_null_refusal_words_every_selection_option_given_beside_a_null():
    assert _nothing.null_refusal({"gpus": [0], "max_used_mib": None}) is None
    assert _nothing.null_refusal({}) is None
    assert _nothing.null_refusal({"match": " ", "pids": None}) == (
        "match is blank; pids is null: a selection that names nothing is refused (omit the option to select any)"
    )
    # A blank entry beside real ones is the option's own check's to refuse (an unknown GPU).
    assert _nothing.nothing_refusal({"gpus": [0, " "]}) is None
