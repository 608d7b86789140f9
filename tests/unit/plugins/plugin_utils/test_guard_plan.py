"""The guard's decisions on the controller (_guard_plan) and its ledger (_guard_ledger): what an alert may free."""

from __future__ import annotations

import base64
import hashlib
import json

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _guard_ledger
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _guard_plan


def alert(host="gpu07", pid="11", ticks="500", status="firing", name=_guard_plan.ORPHAN_ALERT, gpu="0"):
    """An alert as Alertmanager posts it; its fingerprint, as Alertmanager's, differs when its labels differ
    (f<pid> for the defaults)."""
    labels = {"alertname": name, "inventory_hostname": host, "pid": pid, "start_ticks": ticks, "gpu": gpu}
    defaults = (host, ticks, status, name, gpu) == ("gpu07", "500", "firing", _guard_plan.ORPHAN_ALERT, "0")
    fingerprint = (
        "f%s" % pid if defaults else hashlib.sha1(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]
    )
    return {"status": status, "labels": labels, "fingerprint": fingerprint, "startsAt": "2026-12-04T10:00:00Z"}


def test_plan_names_orphans_per_inventory_host_and_refuses_the_rest():
    payload = {
        "alerts": [
            alert(),
            alert(gpu="1"),  # the same process on another GPU: named once, with both alerts
            alert(pid="12", ticks="600"),
            alert(host="gpu99"),
            alert(status="resolved"),
            alert(name="GpuopsNvidiaVllmStalled"),
            alert(pid="x"),
        ]
    }
    found = _guard_plan.plan(payload, ["gpu07", "gpu08"])
    assert [(n["pid"], n["start_ticks"]) for n in found["hosts"]["gpu07"]] == [(11, 500), (12, 600)]
    assert [a["labels"]["gpu"] for a in found["hosts"]["gpu07"][0]["alerts"]] == ["0", "1"]
    whys = [refused["why"] for refused in found["refused"]]
    assert whys == [
        "inventory_hostname gpu99 is not a host of the inventory",
        "the alert is resolved, not firing",
        "not an orphan alert (alertname GpuopsNvidiaVllmStalled): the guard frees only what %s names"
        % _guard_plan.ORPHAN_ALERT,
        "the alert does not name a process: labels pid and start_ticks must be positive whole numbers (ASCII digits)",
    ]
    assert found["refused"][0]["alert"]["labels"]["inventory_hostname"] == "gpu99"
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
    assert _guard_ledger.claim(state, ["gpu07"], "remediate", 600, 1000.0) == {"gpu07": None}
    taken = _guard_ledger.claim(state, ["gpu07", "gpu08"], "remediate", 600, 1300.0)
    assert taken["gpu08"] is None
    assert taken["gpu07"] == "remediate remediation of gpu07 300 s ago; at most one per 600 s (guard_interval)"
    assert _guard_ledger.claim(state, ["gpu07"], "check", 600, 1300.0) == {"gpu07": None}
    assert _guard_ledger.claim(state, ["gpu07"], "remediate", 600, 1601.0) == {"gpu07": None}
    log = tmp_path / "log" / "guard.jsonl"
    _guard_ledger.append(state, str(log), [{"host": "gpu07", "why": "x"}], 0.0)
    assert json.loads(log.read_text()) == {"host": "gpu07", "why": "x", "time": "1970-01-01T00:00:00+00:00"}


def test_one_malformed_alert_is_refused_alone_and_the_others_decided():
    """Issue 40 item 3: "²" passes str.isdigit() and fails int(); labels as a list or a string; an alert that is not
    an object. Each is refused with its own reason; the valid orphan of the same call is still named."""
    listed = {"status": "firing", "labels": ["alertname", "pid"], "fingerprint": "fl"}
    text = {"status": "firing", "labels": "alertname=GpuopsNvidiaOrphanedGpuMemory", "fingerprint": "ft"}
    payload = {
        "alerts": [
            alert(pid="²"),
            alert(),
            alert(pid="12", ticks="٣"),  # an Arabic-Indic digit: isdigit() too
            alert(pid="1" * 30),  # more digits than any PID or tick count
            listed,
            text,
            "not an alert",
            alert(host=["gpu07"]),
        ]
    }
    found = _guard_plan.plan(payload, ["gpu07"])
    assert [(n["pid"], n["start_ticks"]) for n in found["hosts"]["gpu07"]] == [(11, 500)]
    whys = [refused["why"] for refused in found["refused"]]
    assert len(whys) == 7, whys
    assert (
        whys[0]
        == whys[1]
        == whys[2]
        == (
            "the alert does not name a process: labels pid and start_ticks must be positive whole numbers "
            "(ASCII digits)"
        )
    )
    assert whys[3] == whys[4] == "the alert's labels are not a mapping of names to values"
    assert whys[5] == "the alert is not a JSON object"
    assert whys[6] == "inventory_hostname ['gpu07'] is not a host of the inventory"
    assert found["refused"][3]["alert"] == {"fingerprint": "fl", "startsAt": None, "labels": {}}


def test_every_alert_ends_in_one_entry_duplicates_refused():
    """Issue 40 items 4 and 5: the same process on two GPUs is named once with both alerts; the same alert twice
    (two calls of one group coalesced, an Alertmanager retry) is refused once as a duplicate."""
    on_gpu1 = alert(gpu="1")
    calls = [{"alerts": [alert(), on_gpu1]}, {"alerts": [alert()], "truncatedAlerts": 3, "groupKey": "g"}]
    found = _guard_plan.plan(calls, ["gpu07"])
    (named,) = found["hosts"]["gpu07"]
    assert [a["fingerprint"] for a in named["alerts"]] == ["f11", on_gpu1["fingerprint"]]
    whys = [refused["why"] for refused in found["refused"]]
    assert whys == [
        "Alertmanager left 3 alert(s) of group g out of this call (max_alerts of its webhook_configs): they come "
        "with its next notification",
        "the same alert (fingerprint f11) came again: decided once",
    ]


def test_host_lines_put_every_alert_in_one_line():
    """Issue 40 item 4: refused, done, refused for the slot, or failed; a host without an outcome gets a failure line."""
    found = _guard_plan.plan({"alerts": [alert(), alert(gpu="1"), alert(pid="12", ticks="600")]}, ["gpu07"])
    named = found["hosts"]["gpu07"]
    decision = _guard_plan.host_decision(named, [{"pid": 11, "start_ticks": 500}], now=1000.0)
    kill = {"would_signal": [{"pid": 11}], "left_alone": [], "msg": "would signal 1 process(es)"}
    lines = _guard_plan.host_lines(named, "gpu07", "check", decision, {"claimed": ["gpu07"]}, kill)
    refused, done = lines["decided"][0], lines["entries"][0]
    assert refused["pid"] == 12 and refused["why"].startswith("not an orphaned holder now")
    assert done["action"] == "would signal" and done["result"] == [11] and len(done["alerts"]) == 2
    assert lines["failed"] == [] and len(lines["entries"]) == 1

    slot = _guard_plan.host_lines(named, "gpu07", "check", decision, {"claimed": [], "refusals": {"gpu07": "taken"}})
    assert slot["entries"][0]["why"] == "taken" and "action" not in slot["entries"][0]

    failed = _guard_plan.host_lines(named, "gpu07", "remediate", decision, failure="reset_gpus failed: no")
    assert failed["entries"][0]["action"] == "failed" and failed["failed"] == ["reset_gpus failed: no"]
    assert [a["fingerprint"] for a in failed["entries"][0]["alerts"]] == [a["fingerprint"] for a in named[0]["alerts"]]

    blind = _guard_plan.host_lines(named, "gpu07", "check", None, failure="Look failed: no Python")
    assert len(blind["entries"]) == 1 and len(blind["entries"][0]["alerts"]) == 3

    both = _guard_plan.outcomes({"gpu07": named, "gpu08": named}, {"gpu07": {"_guard_lines": lines}}, "check")
    assert both["entries"][:1] == lines["entries"] and both["decided"] == lines["decided"]
    assert both["entries"][1]["host"] == "gpu08" and both["entries"][1]["action"] == "failed"
    assert len(both["entries"][1]["alerts"]) == 3 and both["failed"] == [both["entries"][1]["why"]]
