# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_kill: the selection it ends, and main() with snapshots and end_processes replaced (nothing is ever signalled).

Views are synthetic dicts shaped like _holders.merge's output (see its docstring).
"""

from __future__ import annotations

import copy
import re
import subprocess
import sys

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _gpus, _select, _terminate
from ansible_collections.gpuops.nvidia.plugins.modules import gpu_kill
from module_main import run_main

OWN_CHAIN = {1, 700}
DRIVER_OK = {
    "available": True,
    "error": None,
    "timed_out": False,
    "driver_version": "580.95.05",
    "nvml_version": None,
    "cuda_driver_version": None,
}
NO_DRIVER = dict(
    DRIVER_OK, available=False, error="NVMLError_LibraryNotFound: NVML Shared Library Not Found", driver_version=None
)


def holder(pid, memory, cmdline, comm=None, user="svc-llm", uid=1001, control_only=False, start_ticks=None, ppid=4000):
    """A holder as merge reports it; `memory` maps each GPU index it holds to MiB."""
    gpus = sorted(memory)
    return {
        "pid": pid,
        "ppid": ppid,
        "comm": comm or cmdline.split(" ")[0][:15],
        "cmdline": cmdline,
        "user": user,
        "uid": uid,
        "state": "S",
        "kernel_thread": False,
        "gpus": gpus,
        "control_only": control_only,
        "memory_mib": {str(i): memory[i] for i in gpus},
        "attribution": {str(i): "driver" for i in gpus},
        "start_ticks": start_ticks or pid * 10,
        "parent": {"pid": ppid, "comm": "python3"} if ppid > 1 else None,
    }


def device_user(pid, device_gpus, kind="nvml", comm="dcgm-exporter"):
    return {
        "pid": pid,
        "ppid": 1,
        "comm": comm,
        "cmdline": comm,
        "user": "root",
        "uid": 0,
        "state": "S",
        "start_ticks": pid * 10,
        "device_gpus": list(device_gpus),
        "kind": kind,
    }


def gpu(index, foreign=()):
    return {
        "index": index,
        "uuid": "GPU-%s" % ("aaaa", "bbbb")[index],
        "memory_used_mib": 3,
        "error": None,
        "foreign": [
            {"pid": pid, "used_mib": mib, "type": "compute", "reason": "absent", "comm": None} for pid, mib in foreign
        ],
        "suspects": [],
    }


def make_view(holders, device_users=(), gpus=None, driver=None):
    return {
        "gpus": gpus if gpus is not None else [gpu(0), gpu(1)],
        "holders": list(holders),
        "device_users": list(device_users),
        "driver": dict(driver or DRIVER_OK),
        "index_source": "nvml",
        "scan": "full",
    }


ENGINE = holder(5000001, {0: 70000, 1: 500}, "VLLM::EngineCore")
WORKER = holder(5000002, {1: 60000}, "VLLM::Worker_TP1", user="root", uid=0)
PERSISTENCED = holder(
    5000003, {0: 0, 1: 0}, "/usr/bin/nvidia-persistenced --verbose", comm="nvidia-persiste", user="root", uid=0
)
MPS_CLIENT = holder(5000004, {0: 1200}, "python3 mps_job.py", control_only=True)
EXPORTER = device_user(5000005, [0, 1])
NCCL_PEER = device_user(5000006, [0, 1], kind="cuda", comm="VLLM::Worker_TP")
VIEW = make_view([ENGINE, WORKER, PERSISTENCED, MPS_CLIENT], [EXPORTER, NCCL_PEER])


def pids(entries):
    return [e["pid"] for e in entries]


@pytest.fixture(autouse=True)
def daemons(monkeypatch):
    """PERSISTENCED runs /usr/bin/nvidia-persistenced: _select.daemon_name reads /proc/PID/exe, which these fake
    PIDs lack ({PID: the protected executable it runs})."""
    running = {PERSISTENCED["pid"]: "nvidia-persistenced"}
    monkeypatch.setattr(_select, "daemon_name", lambda pid, start_ticks, proc="/proc", owner=0: running.get(pid))
    return running


def select(indices=None, regex=None, pids=None, users=None, exclude=(), include_protected=False, view=None):
    """(targets, left alone, not holding) as gpu_kill.run splits them."""
    view = VIEW if view is None else view
    chosen = _select.Selection(
        indices,
        pids=pids,
        regex=regex,
        users=users,
        exclude=exclude,
        include_protected=include_protected,
        own_chain=OWN_CHAIN,
    )
    split = chosen.split(view)
    return split["targets"], split["left_alone"], split["not_holding"]


def test_all_gpus_select_every_unprotected_holder_and_mps_clients_never_device_users():
    targets, left, not_holding = select()
    assert pids(targets) == [5000001, 5000002, 5000004]
    assert pids(left) == [5000003] and left[0]["reason"].startswith("protected GPU daemon")
    assert not_holding == []


def test_specific_gpus_select_their_holders_only():
    targets, left, _not_holding = select(indices=[0])
    assert pids(targets) == [5000001, 5000004] and pids(left) == [5000003]
    targets, _left, _not_holding = select(indices=[1])
    assert pids(targets) == [5000001, 5000002]  # the MPS client is listed on GPU 0 only


def test_pids_filter_and_not_holding():
    targets, _left, not_holding = select(indices=[0], pids={5000002, 5000001, 4242, 5000005})
    assert pids(targets) == [5000001]
    assert not_holding == [4242, 5000002, 5000005]  # 5000002 holds GPU 1 only; 5000005 is a device user


def test_match_filters_on_the_full_command_line():
    targets, _left, _not_holding = select(regex=re.compile(r"VLLM::Worker_TP\d"))
    assert pids(targets) == [5000002]


def test_users_by_name_or_uid():
    assert pids(select(users={"root"})[0]) == [5000002]
    assert pids(select(users={"1001"})[0]) == [5000001, 5000004]


def test_exclude_and_include_protected():
    targets, left, _not_holding = select(exclude=["VLLM::EngineCore"], include_protected=True)
    assert pids(targets) == [5000002, 5000003, 5000004]
    assert pids(left) == [5000001] and left[0]["reason"].startswith("excluded")


def test_own_chain_is_protected_even_when_selected_by_pid():
    mine = holder(700, {0: 300}, "ansible-playbook site.yml")
    targets, left, _not_holding = select(pids={700}, include_protected=True, view=make_view([mine]))
    assert targets == [] and pids(left) == [700]


class Recorder:
    """Stands in for Inspector.snapshot (scripted views) and _terminate.end_processes (records, signals nothing)."""

    def __init__(self, *views, survive=()):
        self.views = copy.deepcopy(list(views))  # the module adds fields to the holders it reads
        self.snapshots = []
        self.ended = []
        self.survive = set(survive)

    def snapshot(self, timeout=None, scope="full", indices=None, tolerance_mib=256, **kwargs):  # pylint: disable=unused-argument
        self.snapshots.append((scope, indices))
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]

    def end_processes(self, holders, sig, grace_period, kill_wait, proc="/proc"):  # pylint: disable=unused-argument
        self.ended.append(([h["pid"] for h in holders], sig, grace_period, kill_wait))
        entries = [dict(h, signals=[sig.name]) for h in holders]
        exited = [dict(e, exited_after_s=0.1) for e in entries if e["pid"] not in self.survive]
        survived = [
            dict(e, signals=[sig.name, "SIGKILL"], state="D", reason="unkillable: in uninterruptible sleep (D)")
            for e in entries
            if e["pid"] in self.survive
        ]
        return {"signalled": entries, "exited": exited, "survived": survived, "not_signalled": []}


@pytest.fixture
def recorder(monkeypatch, tmp_path):
    # The host's lock of gpu_kill runs (_terminate.HostLock) in this test's directory, not in this machine's /run/lock.
    monkeypatch.setattr(_terminate, "LOCK_DIRS", (str(tmp_path),))

    def install(*views, survive=()):
        rec = Recorder(*views, survive=survive)
        # A bound method set on the class is not bound again: Inspector.snapshot(...) calls rec.snapshot(...).
        monkeypatch.setattr(_gpus.Inspector, "snapshot", rec.snapshot)
        monkeypatch.setattr(_terminate, "end_processes", rec.end_processes)
        return rec

    return install


def run_module(capsys, args):
    return run_main(gpu_kill, capsys, args)


def warnings(result):
    """The warning texts of a module result (ansible-core >= 2.19 returns them as structured events)."""
    return [w["event"]["msg"] if isinstance(w, dict) else w for w in result.get("warnings", [])]


@pytest.mark.parametrize(
    "args, message, snapshots",
    [
        ({"grace_period": -1}, "invalid option value: grace_period=-1.0 (must not be negative)", 0),
        (
            {"kill_wait": -0.5, "driver_timeout": -2},
            "driver_timeout=-2.0 (must be greater than 0); kill_wait=-0.5 (must not be negative)",
            0,
        ),
        ({"driver_timeout": 0}, "driver_timeout=0.0 (must be greater than 0)", 0),
        ({"grace_period": "nan"}, "grace_period=nan (must be a finite number)", 0),
        ({"kill_wait": "inf"}, "kill_wait=inf (must be a finite number)", 0),
        # Issue 33 item 11: finite, yet no run means them.
        ({"grace_period": 1e308}, "grace_period=1e+308 (must be at most 3600 seconds)", 0),
        ({"kill_wait": 601}, "kill_wait=601.0 (must be at most 600 seconds)", 0),
        ({"driver_timeout": 1e9}, "driver_timeout=1000000000.0 (must be at most 600 seconds)", 0),
        ({"wait": True, "wait_timeout": 86400}, "wait_timeout=86400.0 (must be at most 3600 seconds)", 0),
        ({"wait": True, "poll_interval": 3600}, "poll_interval=3600.0 (must be at most 60 seconds)", 0),
        ({"match": "VLLM::("}, "invalid regex in match 'VLLM::('", 0),
        ({"match": ""}, "match is empty", 0),
        ({"gpus": []}, "gpus is empty", 0),
        ({"pids": []}, "pids is empty", 0),
        ({"pids": [0, 5000001]}, "pids must be positive process IDs, got 0", 0),
        ({"users": []}, "users is empty", 0),
        ({"users": ["no-such-user-gpuops"]}, "no such user on this host: no-such-user-gpuops", 0),
        ({"signal": "FOO"}, "unknown signal 'FOO'", 0),
        ({"gpus": [7]}, "unknown GPU 7: give a GPU by its index (this host has 0, 1), its UUID (0: ", 1),
        ({"gpus": ["GPU-zzzz"]}, "unknown GPU 'GPU-zzzz'", 1),
        ({"gpus": ["١"]}, "unknown GPU '١'", 1),
        ({"gpus": [True]}, "unknown GPU True", 1),
    ],
)
def test_bad_input_fails_before_anything_is_signalled(capsys, recorder, args, message, snapshots):
    rec = recorder(VIEW)
    code, result = run_module(capsys, args)
    assert code == 1 and result["failed"] is True
    assert result["msg"].startswith("nothing was signalled: ") and message in result["msg"]
    assert rec.ended == [] and len(rec.snapshots) == snapshots


def test_bad_option_type_is_rejected_by_the_argument_spec(capsys, recorder):
    rec = recorder(VIEW)
    code, result = run_module(capsys, {"pids": ["not-a-pid"]})
    assert code == 1 and "pids" in result["msg"]
    assert rec.ended == [] and rec.snapshots == []


def test_check_mode_reports_and_signals_nothing(capsys, recorder):
    rec = recorder(VIEW)
    code, result = run_module(capsys, {"gpus": [1], "_ansible_check_mode": True})
    assert code == 0 and result["changed"] is True
    assert pids(result["would_signal"]) == [5000001, 5000002]
    assert pids(result["protected"]) == [5000003] and pids(result["left_alone"]) == [5000003]
    assert result["signalled"] == [] and rec.ended == [] and rec.snapshots == [("full", None)]
    assert result["msg"].startswith("would signal 2 process(es): 5000001 (VLLM::EngineCor), 5000002 (VLLM::Worker_TP)")
    assert pids(result["before"]["holders"]) == pids(VIEW["holders"]) and result["gpus"] == [1]


def test_new_holders_found_after_a_round_are_ended_too_and_respawns_are_named(capsys, recorder):
    child = holder(5000009, {0: 70000}, "VLLM::Worker_TP0")  # same parent (4000) as the engine: a respawn
    rec = recorder(
        make_view([ENGINE, PERSISTENCED]),
        make_view([ENGINE, child, PERSISTENCED]),  # ENGINE still listed (same start): not again
        make_view([PERSISTENCED]),
    )
    code, result = run_module(capsys, {"gpus": ["GPU-aaaa"], "signal": "INT", "grace_period": 1, "kill_wait": 2})
    assert code == 0 and result["changed"] is True
    assert [call[0] for call in rec.ended] == [[5000001], [5000009]]
    assert rec.ended[0][1:] == (_terminate.parse_signal("SIGINT"), 1.0, 2.0)
    assert rec.snapshots == [("listed", None), ("listed", [0]), ("listed", [0])]
    assert pids(result["signalled"]) == [5000001, 5000009] and result["gpus"] == [0]
    assert (
        result["msg"] == "signalled 2 process(es), 2 exited; left alone: PID 5000003 (nvidia-persiste): "
        "protected GPU daemon (nvidia-persistenced)"
    )
    (respawn,) = result["respawned"]
    assert (
        respawn["pid"] == 5000009
        and respawn["replaces"] == 5000001
        and respawn["parent"] == {"pid": 4000, "comm": "python3"}
    )
    (warning,) = warnings(result)
    assert warning.startswith("PID 5000001 (") and "came back as PID 5000009, started by PID 4000 (python3)" in warning
    assert "stop that parent first" in warning


def test_a_reused_pid_with_a_new_start_time_is_ended_again(capsys, recorder):
    again = dict(ENGINE, start_ticks=ENGINE["start_ticks"] + 1)
    rec = recorder(make_view([ENGINE]), make_view([again]), make_view([]))
    code, result = run_module(capsys, {})
    assert code == 0 and [call[0] for call in rec.ended] == [[5000001], [5000001]]
    assert pids(result["respawned"]) == [5000001]


def test_at_most_three_rounds(capsys, recorder):
    views = [make_view([holder(5000010 + n, {0: 1000}, "python3 train.py", ppid=1)]) for n in range(5)]
    rec = recorder(*views)
    code, result = run_module(capsys, {})
    assert code == 0 and [call[0] for call in rec.ended] == [[5000010], [5000011], [5000012]]
    assert len(rec.snapshots) == 3 and pids(result["signalled"]) == [5000010, 5000011, 5000012]
    # Same command line, parent PID 1: respawns by command line (orphans re-parented to init share no parent).
    assert [(r["pid"], r["replaces"], r["parent"]) for r in result["respawned"]] == [
        (5000011, 5000010, None),
        (5000012, 5000010, None),
    ]


def test_a_survivor_fails_the_module_and_ends_the_rounds(capsys, recorder):
    rec = recorder(
        make_view([ENGINE, WORKER]),
        make_view([ENGINE, WORKER, holder(5000009, {1: 1}, "python3 x.py")]),
        survive=[5000002],
    )
    code, result = run_module(capsys, {"gpus": [1]})
    assert code == 1 and result["failed"] is True and result["changed"] is True
    assert [call[0] for call in rec.ended] == [[5000001, 5000002]] and len(rec.snapshots) == 1
    assert result["msg"].startswith(
        "1 selected process(es) survived SIGKILL: PID 5000002 (VLLM::Worker_TP): unkillable"
    )
    assert pids(result["survived"]) == [5000002] and pids(result["exited"]) == [5000001]


def test_device_users_are_never_signalled(capsys, recorder):
    rec = recorder(make_view([], [EXPORTER, NCCL_PEER]))
    code, result = run_module(capsys, {"pids": [5000005, 5000006]})
    assert code == 0 and result["changed"] is False and rec.ended == []
    assert result["not_holding"] == [5000005, 5000006] and result["left_alone"] == []
    assert result["msg"] == (
        "signalled 0 process(es), 0 exited; PID(s) 5000005, 5000006 from pids hold none of the "
        "selected GPUs (or do not exist): nothing to do for them"
    )


def test_mps_clients_listed_by_the_driver_are_ended(capsys, recorder):
    rec = recorder(make_view([MPS_CLIENT]), make_view([]))
    code, result = run_module(capsys, {"gpus": [0]})
    assert code == 0 and result["changed"] is True and [call[0] for call in rec.ended] == [[5000004]]


def test_left_alone_holders_are_named_and_narrowing_is_not_protection(capsys, recorder):
    rec = recorder(VIEW, make_view([ENGINE, PERSISTENCED, MPS_CLIENT]))
    code, result = run_module(capsys, {"pids": [5000002], "gpus": [1]})
    assert code == 0 and [call[0] for call in rec.ended] == [[5000002]]
    assert [(h["pid"], h["reason"]) for h in result["left_alone"]] == [
        (5000001, "not in pids"),
        (5000003, "not in pids"),
    ]
    assert result["protected"] == []
    assert (
        "; left alone: PID 5000001 (VLLM::EngineCor): not in pids; PID 5000003 (nvidia-persiste): not in pids"
        in result["msg"]
    )
    code, result = run_module(capsys, {"users": ["root"], "_ansible_check_mode": True})
    reasons = {h["pid"]: h["reason"] for h in result["left_alone"]}
    assert reasons == {
        5000001: "user svc-llm not in users",
        5000003: "protected GPU daemon (nvidia-persistenced)",
        5000004: "user svc-llm not in users",
    }
    assert pids(result["protected"]) == [5000003]


def test_foreign_entries_are_reported_and_never_signalled(capsys, recorder):
    view = make_view([], gpus=[gpu(0, foreign=[(812345, 40000)]), gpu(1, foreign=[(812346, None)])])
    rec = recorder(view)
    code, result = run_module(capsys, {})
    assert code == 0 and result["changed"] is False and rec.ended == []
    assert [(f["pid"], f["gpu"], f["reason"]) for f in result["foreign"]] == [
        (812345, 0, "absent"),
        (812346, 1, "absent"),
    ]
    assert (
        "the driver lists PID 812345 (40000 MiB) on GPU 0, which no process here holds (a container?): not signalled"
        in result["msg"]
    )
    assert "PID 812346 (memory not reported) on GPU 1" in result["msg"]
    code, result = run_module(capsys, {"gpus": [1]})
    assert pids(result["foreign"]) == [812346]


def test_without_the_driver_library_it_warns_and_works_from_the_scan(capsys, recorder):
    stray = holder(5000001, {}, "python3 train.py")
    rec = recorder(make_view([stray], gpus=[], driver=NO_DRIVER), make_view([], gpus=[], driver=NO_DRIVER))
    code, result = run_module(capsys, {})
    assert code == 0 and [call[0] for call in rec.ended] == [[5000001]] and result["gpus"] is None
    assert any(
        "NVIDIA driver library not usable" in w and "NVML Shared Library Not Found" in w for w in warnings(result)
    )
    code, result = run_module(capsys, {"gpus": [0]})
    assert code == 1 and result["msg"].startswith("nothing was signalled: cannot select GPUs [0]")
    assert result["driver"]["available"] is False


def test_a_hung_driver_is_named_and_holders_come_from_the_scan(capsys, recorder):
    hung = dict(NO_DRIVER, error="an NVML call did not return within 10.0 s", timed_out=True)
    stray = holder(5000001, {}, "python3 train.py")
    rec = recorder(make_view([stray], gpus=[], driver=hung), make_view([], gpus=[], driver=hung))
    code, result = run_module(capsys, {})
    assert code == 0 and [call[0] for call in rec.ended] == [[5000001]]
    assert "NVML did not answer within driver_timeout (the driver may be hung)" in result["msg"]
    assert any("Xid" in w for w in warnings(result))
    # With wait=true the wait's message says it, once, without NVML's own words again.
    hung["error"] = "an NVML call did not return within 10.0 s (driver hung?)"
    recorder(make_view([stray], gpus=[], driver=hung), make_view([], gpus=[], driver=hung))
    code, result = run_module(capsys, {"wait": True, "wait_timeout": 1})
    assert code == 1 and result["msg"].count("NVML did not answer") == 1, result["msg"]
    assert "the driver may be hung; GPU memory release could not be confirmed" in result["msg"]
    assert "did not return" not in result["msg"]
    # NVML silent at the first look and answering in the wait, which times out on memory: the holders still came from
    # the /proc scan alone, and the message says so (the wait's own says nothing of NVML).
    held = dict(gpu(0), memory_used_mib=60000, memory_unexplained=True, unexplained_mib=60000, holder_pids=[])
    recorder(make_view([stray], gpus=[], driver=hung), make_view([], gpus=[held]))
    code, result = run_module(capsys, {"wait": True, "wait_timeout": 0})
    assert code == 1 and result["wait_timed_out"] is True, result
    assert "holders from the /proc scan alone" in result["msg"] and result["msg"].count("NVML did not answer") == 1


def test_with_nothing_to_end_the_wait_takes_the_first_look_and_looks_once(capsys, recorder):
    # One snapshot per call where nothing is ended: the look that found nothing to end is the wait's first poll.
    free = [
        dict(gpu(i), memory_unexplained=False, unexplained_mib=0, memory_reserved_mib=529, holder_pids=[5000003])
        for i in (0, 1)
    ]
    rec = recorder(make_view([PERSISTENCED], gpus=free))
    code, result = run_module(capsys, {"wait": True, "wait_timeout": 5})
    assert code == 0 and result["released"] is True and result["wait"]["polls"] == 1, result
    assert "GPU 1: 3 -> 3 MiB used, holders 1 -> 1" in result["summary"], result["summary"]
    assert rec.snapshots == [("listed", None)] and rec.ended == []


def test_gpus_not_released_fail_the_module_unless_fail_unreleased_is_false(capsys, recorder):
    """Issue 46 item 6: the reset_gpus role goes on waiting after gpu_kill's first slice. With fail_unreleased=false
    the slice that ends with GPU 1 still used returns the same result without failing, so the role needs no
    failed_when (which, on ansible-core 2.19 and later, hides a real failure's message behind its own)."""
    held = dict(gpu(1), memory_used_mib=60000, memory_unexplained=True, unexplained_mib=60000, holder_pids=[])
    free = dict(gpu(0), memory_unexplained=False, unexplained_mib=0, memory_reserved_mib=529, holder_pids=[])
    before = [dict(free, holder_pids=[]), dict(held, holder_pids=[WORKER["pid"]], unexplained_mib=0)]
    views = (make_view([WORKER], gpus=before), make_view([], gpus=[free, held]))
    recorder(*views)
    code, failed = run_module(capsys, {"wait": True, "wait_timeout": 0, "gpus": [1]})
    assert code == 1 and failed["wait_timed_out"] is True and failed["released"] is False, failed
    recorder(*views)
    code, result = run_module(capsys, {"wait": True, "wait_timeout": 0, "gpus": [1], "fail_unreleased": False})
    assert code == 0 and not result.get("failed") and result["wait_timed_out"] is True, result

    # The same words, but for the seconds each slice took (a loaded machine takes 0.01 s where another takes 0.00 s).
    def seconds(text):
        return re.sub(r"\d+\.\d+ s\b", "N s", str(text))

    assert result["released"] is False and "GPU 1: 60000 MiB used" in result["msg"]
    assert seconds(result["msg"]) == seconds(failed["msg"]) and seconds(result["summary"]) == seconds(failed["summary"])


def test_nothing_to_do_is_not_a_change(capsys, recorder):
    rec = recorder(make_view([PERSISTENCED]))
    code, result = run_module(capsys, {})
    assert code == 0 and result["changed"] is False and rec.ended == []
    assert pids(result["protected"]) == [5000003]
    assert result["signalled"] == [] and result["respawned"] == [] and pids(result["before"]["holders"]) == [5000003]


def test_check_mode_with_wait_fails_where_a_selected_gpu_is_lost_and_signals_nothing(capsys, recorder):
    """A reset of a GPU that fell off the bus fails whatever it ends: check mode says so, with the wait's next step."""
    lost = dict(
        gpu(1),
        memory_used_mib=None,
        error="GPU is lost",
        memory_unexplained=True,
        unexplained_mib=None,
        memory_reserved_mib=None,
        holder_pids=[5000002],
    )
    free = dict(gpu(0), memory_unexplained=False, unexplained_mib=0, memory_reserved_mib=529, holder_pids=[])
    rec = recorder(make_view([WORKER], gpus=[free, lost]))
    code, result = run_module(capsys, {"wait": True, "_ansible_check_mode": True})
    assert code == 1 and rec.ended == [] and pids(result["would_signal"]) == [5000002]
    # Worded as the run would leave GPU 1: its holder ended (so not named to be ended first), the GPU still lost.
    assert result["msg"].startswith(
        "would signal 1 process(es): 5000002 (VLLM::Worker_TP); a real run would fail whatever "
        "it ended: not free: GPU 1: error GPU is lost, no selected holder; next: NVML answers "
        "GPU 1 with an error (GPU is lost)"
    ), result["msg"]
    assert result["msg"].endswith("then reset it (nvidia-smi --gpu-reset -i 1) or reboot the host"), result["msg"]
    assert "GPU 0" not in result["msg"].split("would fail", 1)[1]
    assert result["summary"][0] == "FAILED (check mode): " + result["msg"]
    # Without wait there is nothing to predict; a GPU whose holders may free it is not predicted to fail either.
    assert run_module(capsys, {"_ansible_check_mode": True})[0] == 0
    assert run_module(capsys, {"wait": True, "gpus": [0], "_ansible_check_mode": True})[0] == 0


def test_check_mode_with_wait_names_the_gpus_that_ending_the_holders_would_not_free(capsys, recorder):
    """GPU 1 has 5000 MiB that no process explains and no holder; GPU 0 a holder. Check mode with wait says that ending
    the holders would not free GPU 1 (a real run waits its timeout there), in its message, its summary and
    "would_stay", and still passes: the driver may free that memory during the wait. GPU 0, which its holder may free,
    is not named."""
    held = dict(gpu(0), memory_used_mib=70000, memory_unexplained=False, unexplained_mib=0, holder_pids=[5000001])
    leaked = dict(gpu(1), memory_used_mib=5000, memory_unexplained=True, unexplained_mib=5000, holder_pids=[])
    engine = holder(5000001, {0: 70000}, "VLLM::EngineCore")
    rec = recorder(make_view([engine], gpus=[held, leaked]))
    code, result = run_module(capsys, {"wait": True, "_ansible_check_mode": True})
    assert code == 0 and not result.get("failed") and rec.ended == [], result
    assert result["would_stay"].startswith("not free: GPU 1: 5000 MiB used, 5000 MiB that no listed process explains")
    assert "GPU 0" not in result["would_stay"], result["would_stay"]
    clause = "; ending the holders would not free these GPUs, and a real run would wait its whole timeout for them"
    assert clause in result["msg"] and result["msg"].endswith(result["would_stay"]), result["msg"]
    assert result["summary"][0].startswith("check mode: would signal 1 process(es), nothing was signalled" + clause)
    # Without wait, or with GPU 0 alone selected, there is nothing of it to say.
    for args in ({"_ansible_check_mode": True}, {"wait": True, "gpus": [0], "_ansible_check_mode": True}):
        code, result = run_module(capsys, args)
        assert code == 0 and "would_stay" not in result and "would not free" not in result["msg"], result


def test_check_mode_with_wait_fails_where_the_driver_does_not_answer(capsys, recorder):
    hung = dict(NO_DRIVER, error="an NVML call did not return within 10.0 s", timed_out=True)
    rec = recorder(make_view([holder(5000001, {}, "python3 train.py")], gpus=[], driver=hung))
    code, result = run_module(capsys, {"wait": True, "_ansible_check_mode": True})
    assert code == 1 and rec.ended == []
    assert result["msg"].startswith("would signal 1 process(es): 5000001 (python3); "), result["msg"]
    assert (
        "; a real run would fail whatever it ended: NVML did not answer within driver_timeout (10.0 s)" in result["msg"]
    )
    # The holder the scan found would be ended: the prediction does not name it as left.
    assert "holders found by the /proc scan alone" not in result["msg"]


# --- a selection option that names nothing (issue: a null selection widened the reset to everything) ----------------


@pytest.mark.parametrize(
    "args, message",
    # Null options: the module takes None as left out; the action plugin refuses them on the controller, with these
    # words (tests/unit/plugins/plugin_utils/test_interpreter.py).
    [
        ({"match": "   "}, "match is blank"),
        ({"gpus": [None]}, "gpus is a list of nothing but null or blank entries"),
        ({"gpus": ["  ", ""]}, "gpus is a list of nothing but null or blank entries"),
        ({"users": [" "]}, "users is a list of nothing but null or blank entries"),
        ({"units": [""]}, "units is a list of nothing but null or blank entries"),
    ],
)
def test_a_selection_that_names_nothing_is_refused_before_the_first_look(capsys, recorder, args, message):
    rec = recorder(VIEW)
    code, result = run_module(capsys, dict(args, _ansible_check_mode=False))
    assert code == 1 and result["failed"] is True
    assert result["msg"].startswith("nothing was signalled: %s" % message), result["msg"]
    assert "omit the option to select any" in result["msg"]
    assert rec.ended == [] and rec.snapshots == []


def test_options_left_out_still_select_every_holder(capsys, recorder):
    rec = recorder(VIEW)
    code, result = run_module(capsys, {"_ansible_check_mode": True})
    assert code == 0 and pids(result["would_signal"]) == [5000001, 5000002, 5000004] and rec.ended == []


# --- stop_owners and owners that reach beyond the selection ----------------------------------------------------------


def owned(entry, unit, restart="always"):
    return dict(entry, owner={"systemd_unit": unit, "unit_restart": restart, "container_id": None, "pod_uid": None})


SPAN_A = owned(holder(5000011, {0: 30000}, "python3 -m vllm serve a"), "vllm@a.service")
SPAN_B = owned(holder(5000012, {1: 30000}, "VLLM::Worker_TP1"), "vllm@a.service")
OTHER = owned(holder(5000013, {0: 20000}, "python3 train.py"), "train.service", restart="no")
SPAN_VIEW = make_view([SPAN_A, SPAN_B, OTHER])


@pytest.fixture
def systemctl(monkeypatch):
    calls = []

    def run_command(self, argv, **kwargs):  # pylint: disable=unused-argument
        calls.append(list(argv))
        return 0, "", ""

    monkeypatch.setattr(gpu_kill.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(gpu_kill.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/" + name)
    return calls


@pytest.mark.parametrize("check_mode", [False, True])
def test_an_owner_unit_that_holds_unselected_gpus_is_not_stopped(capsys, recorder, systemctl, check_mode):
    rec = recorder(SPAN_VIEW)
    code, result = run_module(capsys, {"gpus": [0], "stop_owners": True, "_ansible_check_mode": check_mode})
    assert code == 1 and result["failed"] is True and systemctl == [] and rec.ended == []
    assert result["msg"].startswith("nothing was signalled: stop_owners would stop systemd unit vllm@a.service")
    assert "PID 5000012 (VLLM::Worker_TP) holds GPU 1, outside the selection" in result["msg"]
    assert "stop_spanning_owners=true" in result["msg"]
    (beyond,) = result["owners_beyond_selection"]
    assert (beyond["kind"], beyond["command"]) == ("unit", "systemctl stop vllm@a.service")
    assert [(p["pid"], p["gpus"]) for p in beyond["processes"]] == [(5000012, [1])]


def test_an_owner_unit_with_unselected_pids_on_selected_gpus_is_not_stopped(capsys, recorder, systemctl):
    rec = recorder(SPAN_VIEW)
    code, result = run_module(capsys, {"pids": [5000011], "stop_owners": True})
    assert code == 1 and systemctl == [] and rec.ended == []
    assert "PID 5000012 (VLLM::Worker_TP) holds GPU 1, not selected (not in pids)" in result["msg"]


def test_stop_spanning_owners_stops_the_unit_and_names_what_it_ends(capsys, recorder, systemctl):
    rec = recorder(SPAN_VIEW)
    code, result = run_module(capsys, {"gpus": [0], "stop_owners": True, "stop_spanning_owners": True})
    assert code == 0 and systemctl == [["/usr/bin/systemctl", "stop", "vllm@a.service"]]
    assert result["stopped_units"] == ["vllm@a.service"] and rec.ended[0][0] == [5000011, 5000013]
    assert (
        "stopped systemd unit vllm@a.service, and with it, beyond the selection: PID 5000012 (VLLM::Worker_TP) holds "
        "GPU 1, outside the selection"
    ) in result["msg"]


def test_check_mode_with_stop_spanning_owners_names_the_unit_and_what_it_would_end(capsys, recorder, systemctl):
    rec = recorder(SPAN_VIEW)
    code, result = run_module(
        capsys, {"gpus": [0], "stop_owners": True, "stop_spanning_owners": True, "_ansible_check_mode": True}
    )
    assert code == 0 and systemctl == [] and rec.ended == []
    assert result["would_stop_units"] == ["vllm@a.service"] and pids(result["would_signal"]) == [5000011, 5000013]
    assert "would stop systemd unit vllm@a.service first (stop_owners)" in result["msg"]
    assert "would stop systemd unit vllm@a.service, and with it, beyond the selection: PID 5000012" in result["msg"]


def test_an_owner_unit_inside_the_selection_is_stopped_as_before(capsys, recorder, systemctl):
    rec = recorder(SPAN_VIEW)
    code, result = run_module(capsys, {"gpus": [0, 1], "stop_owners": True})
    assert code == 0 and systemctl == [["/usr/bin/systemctl", "stop", "vllm@a.service"]]
    assert result["owners_beyond_selection"] == [] and rec.ended[0][0] == [5000011, 5000012, 5000013]


# --- one run at a time per host (issue 33 item 10) --------------------------------------------------------------------


def test_a_run_that_cannot_get_the_host_lock_in_time_signals_nothing_and_names_the_other_run(
    capsys, recorder, tmp_path
):
    rec = recorder(VIEW)
    code = (
        "import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n"
    )
    other = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / _terminate.LOCK_NAME)], stdout=subprocess.PIPE)
    try:
        assert other.stdout.readline().strip() == b"locked"
        code, result = run_module(capsys, {"lock_timeout": 0.2})
        assert code == 1 and rec.ended == [] and rec.snapshots == [], result
        assert result["msg"].startswith(
            "nothing was signalled: another gpu_kill run on this host (PID %d (" % other.pid
        )
        # Check mode takes no lock: it looks, and says another run is ending processes now.
        code, result = run_module(capsys, {"_ansible_check_mode": True})
        assert code == 0 and pids(result["would_signal"]) == [5000001, 5000002, 5000004], result
        assert "another gpu_kill run on this host (PID %d) is ending processes now" % other.pid in warnings(result)[0]
    finally:
        other.kill()
        other.wait()
        other.stdout.close()
    code, result = run_module(capsys, {"grace_period": 1})
    assert code == 0 and result["lock_waited_s"] == 0.0 and not result["msg"].startswith("waited")


def test_a_process_titled_as_a_gpu_daemon_is_ended_like_any_holder(capsys, recorder):
    """Issue 33 item 2: `exec -a nvidia-persistenced python3 ...` with 40000 MiB on GPU 0 was left alone as a
    "protected GPU daemon". Its executable is python3: it is a holder like any other."""
    titled = holder(5000007, {0: 40000}, "nvidia-persistenced", comm="nvidia-persiste", user="root", uid=0)
    rec = recorder(make_view([titled, PERSISTENCED]))
    code, result = run_module(capsys, {"gpus": [0], "grace_period": 1})
    assert code == 0 and rec.ended[0][0] == [5000007], result
    assert pids(result["protected"]) == [5000003]
