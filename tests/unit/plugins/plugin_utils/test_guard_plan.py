"""The guard's decisions on the controller (_guard_plan) and its ledger (_guard_ledger): what an alert may free."""

from __future__ import annotations

import base64
import json

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _guard_ledger
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _guard_plan


def alert(host="gpu07", pid="11", ticks="500", status="firing", name=_guard_plan.ORPHAN_ALERT):
    labels = {"alertname": name, "inventory_hostname": host, "pid": pid, "start_ticks": ticks, "gpu": "0"}
    return {"status": status, "labels": labels, "fingerprint": "f" + pid, "startsAt": "2026-12-04T10:00:00Z"}


def test_plan_names_orphans_per_inventory_host_and_refuses_the_rest():
    payload = {
        "alerts": [
            alert(),
            alert(pid="11"),  # the same process on another GPU: once
            alert(pid="12", ticks="600"),
            alert(host="gpu99"),
            alert(status="resolved"),
            alert(name="GpuopsNvidiaVllmStalled"),
            alert(pid="x"),
        ]
    }
    found = _guard_plan.plan(payload, ["gpu07", "gpu08"])
    assert [(n["pid"], n["start_ticks"]) for n in found["hosts"]["gpu07"]] == [(11, 500), (12, 600)]
    whys = [refused["why"] for refused in found["refused"]]
    assert whys == [
        "inventory_hostname gpu99 is not a host of the inventory",
        "the alert is resolved, not firing",
        "not an orphan alert (alertname GpuopsNvidiaVllmStalled): the guard frees only what %s names"
        % _guard_plan.ORPHAN_ALERT,
        "the alert does not name a process: labels pid and start_ticks must be positive whole numbers",
    ]
    assert found["refused"][0]["alert"]["fingerprint"] == "f11"
    assert _guard_plan.plan({"no": "alerts"}, ["gpu07"])["hosts"] == {}


def test_host_decision_keeps_only_the_same_orphaned_processes():
    named = _guard_plan.plan({"alerts": [alert(), alert(pid="12", ticks="600"), alert(pid="13")]}, ["gpu07"])
    orphans = [{"pid": 11, "start_ticks": 500}, {"pid": 12, "start_ticks": 900}]
    found = _guard_plan.host_decision(named["hosts"]["gpu07"], orphans, now=1000.0)
    assert found["pids"] == [11] and found["pid_start_ticks"] == {"11": 500} and found["blocked"] is None
    whys = {entry["pid"]: entry["why"] for entry in found["refused"]}
    assert whys[12] == "PID 12 was reused: the process now started at tick 900, the alert named tick 600"
    assert whys[13].startswith("not an orphaned holder now")


def test_a_running_redeploy_blocks_and_a_stale_marker_does_not():
    named = _guard_plan.plan({"alerts": [alert()]}, ["gpu07"])["hosts"]["gpu07"]
    orphans = [{"pid": 11, "start_ticks": 500}]
    marker = {"content": base64.b64encode(json.dumps({"started": 900.0}).encode()).decode()}
    running = _guard_plan.host_decision(named, orphans, marker, now=1000.0, max_age=3600.0)
    assert running["pids"] == [] and running["blocked"] == "a redeploy of this host is running (started 100 s ago)"
    assert running["refused"][0]["why"] == running["blocked"]
    stale = _guard_plan.host_decision(named, orphans, marker, now=900.0 + 7200, max_age=3600.0)
    assert stale["pids"] == [11]
    missing = _guard_plan.host_decision(named, orphans, {"failed": True, "msg": "file not found"}, now=1000.0)
    assert missing["pids"] == [11]


def test_ledger_claims_once_per_interval_and_mode(tmp_path):
    state = str(tmp_path / "state")
    assert _guard_ledger.claim(state, "gpu07", "remediate", 600, 1000.0) == (True, None)
    taken, why = _guard_ledger.claim(state, "gpu07", "remediate", 600, 1300.0)
    assert not taken and why.startswith("remediate remediation of gpu07 300 s ago; at most one per 600 s")
    assert _guard_ledger.claim(state, "gpu07", "check", 600, 1300.0) == (True, None)
    assert _guard_ledger.claim(state, "gpu08", "remediate", 600, 1300.0) == (True, None)
    assert _guard_ledger.claim(state, "gpu07", "remediate", 600, 1601.0) == (True, None)
    log = tmp_path / "log" / "guard.jsonl"
    _guard_ledger.append(state, str(log), [{"host": "gpu07", "why": "x"}], 0.0)
    assert json.loads(log.read_text()) == {"host": "gpu07", "why": "x", "time": "1970-01-01T00:00:00+00:00"}
