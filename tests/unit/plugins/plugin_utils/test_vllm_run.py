# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/plugin_utils/_vllm_run.py: the run-state of a vllm_server instance, and the phases the tags select."""

from __future__ import annotations

import base64

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_run as r

CFG = {"gpus": [0], "service_manager": "detached", "log_file": "/var/log/vllm/a.log", "served_model_name": "a"}
OLD = dict(CFG, gpus=[1])
PLANNED = {
    "name": "a",
    "cfg": CFG,
    "unit": None,
    "url": "http://127.0.0.1:8000",
    "old": OLD,
    "old_url": "http://127.0.0.1:8001",
    "old_unit": None,
    "old_manager": "systemd",
    "old_address": ["127.0.0.1", 8001],
    "old_container": "vllm-a",
    "address": ["127.0.0.1", 8000],
    "changed": ["configuration"],
    "reasons": ["configuration changed"],
    "running": True,
}


def fresh(**changes):
    return dict(r.step(PLANNED, "compare", api_key=None, now=100.0), **changes)


def test_compare_starts_a_run_with_nothing_done():
    run = fresh()
    assert run["reasons"] == ["configuration changed"] and run["cfg"] is CFG and run["api_key"] == ""
    assert (
        run["stop"] == {"manager": "systemd", "address": ["127.0.0.1", 8001], "container": "vllm-a"}
        and run["down_at"] == 100.0
    )
    assert (run["failure"], run["hook_failure"], run["rollback"], run["kill"], run["log_offset"]) == (
        "",
        "",
        "",
        {},
        None,
    )


def test_a_failure_keeps_the_free_phase_and_the_gate_figures():
    run = fresh(kill={"signalled": [{"pid": 7}]})
    gate = {"msg": "below", "acceptance_rate": 0.01}
    failed = r.step(run, "failed", task={"name": "Gate", "action": "gpuops.nvidia.vllm_acceptance"}, result=gate)
    assert failed["failure"] == "Gate: below" and failed["rollback"] == r.NOT_ROLLED_BACK
    assert failed["kill_kept"] == {"signalled": [{"pid": 7}]} and failed["acceptance"] == gate
    killed = r.step(
        fresh(), "failed", task={"name": "End", "action": "gpuops.nvidia.gpu_kill"}, result={"signalled": []}
    )
    assert killed["kill_kept"] == {"signalled": []} and killed["acceptance"] == {}


@pytest.mark.parametrize(
    "detached, log_before, offset",
    [
        ({"log_offset": 12}, {"skipped": True}, 12),
        ({"skipped": True}, {"stat": {"exists": True, "size": 40}}, 40),
        ({"skipped": True}, {"stat": {"exists": False}}, 0),
        ({"skipped": True}, {"skipped": True}, None),
    ],
)
def test_started_notes_where_the_log_lines_begin(detached, log_before, offset):
    assert r.step(fresh(), "started", detached=detached, log_before=log_before)["log_offset"] == offset


def test_the_rollback_switches_to_the_previous_configuration_and_its_key():
    key = {"content": base64.b64encode(b"VLLM_API_KEY=old-key\n").decode()}
    run = r.step(fresh(log_offset=5, api_key="new"), "rollback_to", planned=PLANNED, deployed_key=key)
    assert run["cfg"] is OLD and run["url"] == PLANNED["old_url"] and run["log_offset"] is None
    assert run["stop"] == {"manager": "detached", "address": ["127.0.0.1", 8000], "container": None}
    assert run["api_key"] == "old-key"
    unread = r.step(fresh(api_key="new"), "rollback_to", planned=PLANNED, deployed_key={"skipped": True})
    assert unread["api_key"] == "new"
    changed = r.step(fresh(api_key="new"), "rollback_to", planned=dict(PLANNED, changed=["API key"]), deployed_key={})
    assert changed["api_key"] == ""


def test_the_rollback_notes():
    assert r.step(fresh(), "rolled_back", planned=PLANNED, ready={"healthy_after_s": 2.25})["rollback"] == (
        "rolled back to the previous configuration, healthy again after 2.2 s"
    )
    assert (
        r.step(fresh(), "rolled_back", planned=dict(PLANNED, old=None), ready={})["rollback"] == r.NOTHING_TO_GO_BACK_TO
    )
    failed = r.step(fresh(), "rollback_failed", task="Start", result={"msg": "no"}, log_tail={"stdout_lines": ["x"]})
    assert failed["rollback"] == "the rollback failed too: Start: no" and failed["rollback_log_tail"][
        "stdout_lines"
    ] == ["x"]
    with pytest.raises(ValueError):
        r.step(fresh(), "nothing")


def test_the_report_reads_a_failure_from_the_run_state_not_from_stale_registers():
    run = r.step(fresh(), "failed", task={"name": "Start", "action": "x"}, result={"msg": "down"})
    stale = {
        "acceptance": {"acceptance_rate": 0.9},
        "ready": {"healthy_after_s": 1.0},
        "log_tail": {"stdout_lines": ["l"]},
    }
    report = r.report([], PLANNED, run, stale, "False", 30, 110.0)
    entry = report[-1]
    assert entry["action"] == "FAILED" and entry["error"] == "Start: down" and entry["acceptance"] is None
    assert entry["log_tail"] == ["l"] and entry["leftovers"] == []
    done = r.report(report, PLANNED, fresh(kill={"signalled": [{"pid": 3, "comm": "x"}]}), {}, False, 30, 112.5)
    assert done[-1]["action"] == "redeployed" and done[-1]["down_s"] == 12.5 and done[-1]["leftovers"][0]["pid"] == 3
    assert r.report([], PLANNED, fresh(), {}, True, 30, 101.0)[-1]["action"] == "would redeploy"


def test_attempts_and_restores():
    failed, redeployed = {"name": "a", "action": "FAILED", "reasons": ["x"]}, {"name": "a", "action": "redeployed"}
    assert r.attempts([], "a") and r.attempts([failed], "a") and not r.attempts([failed], "b")
    assert r.restores([dict(redeployed, reasons=["x"])], PLANNED, False)
    assert not r.restores([dict(redeployed, reasons=["x"])], PLANNED, True)
    assert not r.restores([dict(redeployed, reasons=["x"])], dict(PLANNED, running=False), False)
    assert r.restores([dict(failed, rollback="rolled back to the previous configuration")], PLANNED, False)
    assert not r.restores([dict(failed, rollback=r.NOT_ROLLED_BACK)], PLANNED, False)


@pytest.mark.parametrize(
    "run_tags, skip_tags, dry, refused",
    [
        (["all"], [], False, ""),
        (["vllm_server_preflight"], [], True, ""),
        (["all"], ["vllm_server_gate"], False, ""),
        (["vllm_server_stop"], [], False, "--tags selects vllm_server_stop"),
        (["all"], ["vllm_server_preflight"], False, "--skip-tags vllm_server_preflight"),
        (["all"], ["vllm_server_rollback"], False, "--skip-tags vllm_server_rollback"),
        (["vllm_server_" + p for p in ("preflight", "drain", "stop", "free", "start")], [], False, ""),
        # The bare tags of before select nothing now: refused, with their new names, and nothing runs.
        (["preflight", "drain", "stop", "free", "start"], [], True, "the tags of vllm_server are prefixed"),
        (["all"], ["gate"], True, "the tags of vllm_server are prefixed"),
    ],
)
def test_the_tags_select_whole_phases(run_tags, skip_tags, dry, refused):
    found = r.phases(run_tags, skip_tags)
    assert found["dry"] == dry and found["problem"].startswith(refused) and bool(found["problem"]) == bool(refused)


def test_a_bare_tag_of_before_is_refused_with_its_new_name():
    assert r.phases(["stop"], ["gate"])["problem"] == (
        "the tags of vllm_server are prefixed with its name now (vllm_server_preflight, vllm_server_drain, "
        "vllm_server_stop, vllm_server_free, vllm_server_start, vllm_server_gate, vllm_server_rollback): "
        "tag stop is vllm_server_stop; tag gate is vllm_server_gate"
    )


def test_an_instances_files_come_from_its_run_state_or_its_plan():
    run = {"cfg": {"argv": ["vllm"]}, "api_key": "k", "unit_text": "[Unit]", "url": "u"}
    assert r.files(run) == {"cfg": {"argv": ["vllm"]}, "api_key": "k", "unit": "[Unit]"}
    assert r.files({"cfg": {}, "unit": None, "reasons": []}, "given") == {"cfg": {}, "api_key": "given", "unit": None}
