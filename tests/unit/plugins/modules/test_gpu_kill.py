# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_kill: select_targets, and main() with snapshots and end_processes replaced (nothing is ever signalled)."""
from __future__ import annotations

import json
import re

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpuops.nvidia.plugins.module_utils import _gpus, _terminate
from ansible_collections.gpuops.nvidia.plugins.modules import gpu_kill

OWN_CHAIN = {1, 700}
DRIVER_OK = {"available": True, "error": None, "timed_out": False, "driver_version": "580.95.05",
             "nvml_version": None, "cuda_driver_version": None}
PARAMS = {"pids": None, "users": None, "exclude": [], "include_protected": False}


def holder(pid, gpus, cmdline, comm=None, user="svc-llm", uid=1001, control_only=False, start_ticks=None):
    return {"pid": pid, "ppid": 4000, "comm": comm or cmdline.split(" ")[0][:15], "cmdline": cmdline, "user": user,
            "uid": uid, "state": "S", "gpus": list(gpus), "control_only": control_only,
            "start_ticks": start_ticks or pid * 10}


ENGINE = holder(5000001, [0, 1], "VLLM::EngineCore")
WORKER = holder(5000002, [1], "VLLM::Worker_TP1", user="root", uid=0)
PERSISTENCED = holder(5000003, [0, 1], "/usr/bin/nvidia-persistenced --verbose", comm="nvidia-persiste", user="root", uid=0)
PROBE = holder(5000004, [], "python3 probe.py", control_only=True)
VIEW = {"gpus": [{"index": 0, "uuid": "GPU-aaaa"}, {"index": 1, "uuid": "GPU-bbbb"}],
        "holders": [ENGINE, WORKER, PERSISTENCED, PROBE], "driver": DRIVER_OK}


def pids(entries):
    return [e["pid"] for e in entries]


def select(indices=None, regex=None, **params):
    return gpu_kill.select_targets(VIEW, dict(PARAMS, **params), indices, regex, OWN_CHAIN)


def test_all_gpus_select_every_unprotected_holder_including_control_only():
    targets, protected, not_holding = select()
    assert pids(targets) == [5000001, 5000002, 5000004]
    assert pids(protected) == [5000003] and protected[0]["reason"].startswith("protected GPU daemon")
    assert not_holding == []


def test_specific_gpus_exclude_control_only_holders():
    targets, protected, _not_holding = select(indices=[0])
    assert pids(targets) == [5000001] and pids(protected) == [5000003]


def test_pids_filter_and_not_holding():
    targets, _protected, not_holding = select(indices=[0], pids=[5000002, 5000001, 4242])
    assert pids(targets) == [5000001]
    assert not_holding == [4242, 5000002]  # 5000002 holds GPU 1 only


def test_match_filters_on_the_full_command_line():
    targets, _protected, _not_holding = select(regex=re.compile(r"VLLM::Worker_TP\d"))
    assert pids(targets) == [5000002]


def test_users_by_name_or_uid():
    assert pids(select(users=["root"])[0]) == [5000002]
    assert pids(select(users=["1001"])[0]) == [5000001, 5000004]


def test_exclude_and_include_protected():
    targets, protected, _not_holding = select(exclude=["VLLM::EngineCore"], include_protected=True)
    assert pids(targets) == [5000002, 5000003, 5000004]
    assert pids(protected) == [5000001] and protected[0]["reason"].startswith("excluded")


def test_own_chain_is_protected_even_when_selected_by_pid():
    mine = holder(700, [0], "ansible-playbook site.yml")
    view = dict(VIEW, holders=[mine])
    targets, protected, _not_holding = gpu_kill.select_targets(view, dict(PARAMS, pids=[700], include_protected=True),
                                                               None, None, OWN_CHAIN)
    assert targets == [] and pids(protected) == [700]


class Recorder:
    """Stands in for Inspector.snapshot (scripted views) and _terminate.end_processes (records, signals nothing)."""

    def __init__(self, *views):
        self.views = list(views)
        self.snapshots = 0
        self.ended = []

    def snapshot(self, inspector, timeout=None):  # pylint: disable=unused-argument
        self.snapshots += 1
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]

    def end_processes(self, holders, sig, grace_period, kill_wait):
        self.ended.append(([h["pid"] for h in holders], sig, grace_period, kill_wait))
        entries = [dict(h, signals=[sig.name], exited_after_s=0.1) for h in holders]
        return {"signalled": entries, "exited": entries, "survived": [], "not_signalled": []}


@pytest.fixture
def recorder(monkeypatch):
    def install(*views):
        rec = Recorder(*views)
        monkeypatch.setattr(_gpus.Inspector, "snapshot", lambda self, timeout=None: rec.snapshot(self, timeout))
        monkeypatch.setattr(_terminate, "end_processes", rec.end_processes)
        return rec
    return install


def run_module(capsys, args):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exited:
            gpu_kill.main()
    return exited.value.code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("args, message, snapshots", [
    ({"grace_period": -1}, "must not be negative: grace_period=-1.0", 0),
    ({"kill_wait": -0.5, "driver_timeout": -2}, "must not be negative: driver_timeout=-2.0, kill_wait=-0.5", 0),
    ({"match": "VLLM::("}, "invalid regex in match 'VLLM::('", 0),
    ({"signal": "FOO"}, "unknown signal 'FOO'", 0),
    ({"gpus": [7]}, "unknown GPU 7: this host has indices [0, 1]", 1),
    ({"gpus": ["GPU-zzzz"]}, "unknown GPU 'GPU-zzzz'", 1),
])
def test_bad_input_fails_before_anything_is_signalled(capsys, recorder, args, message, snapshots):
    rec = recorder(VIEW)
    code, result = run_module(capsys, args)
    assert code == 1 and result["failed"] is True
    assert result["msg"].startswith("nothing was signalled: ") and message in result["msg"]
    assert rec.ended == [] and rec.snapshots == snapshots


def test_bad_option_type_is_rejected_by_the_argument_spec(capsys, recorder):
    rec = recorder(VIEW)
    code, result = run_module(capsys, {"pids": ["not-a-pid"]})
    assert code == 1 and "pids" in result["msg"]
    assert rec.ended == [] and rec.snapshots == 0


def test_check_mode_reports_and_signals_nothing(capsys, recorder):
    rec = recorder(VIEW)
    code, result = run_module(capsys, {"gpus": [1], "_ansible_check_mode": True})
    assert code == 0 and result["changed"] is True
    assert pids(result["would_signal"]) == [5000001, 5000002]
    assert pids(result["protected"]) == [5000003]
    assert result["signalled"] == [] and rec.ended == []
    assert result["msg"].startswith("would signal 2 process(es)")


def test_new_holders_found_after_a_round_are_ended_too(capsys, recorder):
    child = holder(5000009, [0], "VLLM::Worker_TP0")
    rec = recorder(dict(VIEW, holders=[ENGINE, PERSISTENCED]),
                   dict(VIEW, holders=[ENGINE, child, PERSISTENCED]),  # ENGINE still listed (same start): not again
                   dict(VIEW, holders=[PERSISTENCED]))
    code, result = run_module(capsys, {"gpus": ["GPU-aaaa"], "signal": "INT", "grace_period": 1, "kill_wait": 2})
    assert code == 0 and result["changed"] is True
    assert [call[0] for call in rec.ended] == [[5000001], [5000009]]
    assert rec.ended[0][1:] == (_terminate.parse_signal("SIGINT"), 1.0, 2.0)
    assert pids(result["signalled"]) == [5000001, 5000009] and result["gpus"] == [0]
    assert result["msg"] == "signalled 2 process(es), 2 exited"


def test_nothing_to_do_is_not_a_change(capsys, recorder):
    rec = recorder(dict(VIEW, holders=[PERSISTENCED]))
    code, result = run_module(capsys, {})
    assert code == 0 and result["changed"] is False and rec.ended == []
    assert pids(result["protected"]) == [5000003]
