# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/plugin_utils/_vllm_report.py: the vllm_server role's entries, summary and failure message."""

from __future__ import annotations

from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_report as r

NEW = {
    "name": "a",
    "gpus": [0, 1],
    "speculative_config": {"method": "dflash"},
    "gpu_memory_utilization": 0.85,
    "log_file": "/var/log/vllm/a.log",
    "argv": ["vllm", "serve"],
    "service_manager": "detached",
}
OLD = dict(NEW, gpu_memory_utilization=0.9, argv=["vllm", "serve", "old"])
PLANNED = {"name": "a", "cfg": NEW, "url": "http://127.0.0.1:8000", "old": OLD, "running": True}
DRAIN = {
    "drained": True,
    "drain_s": 1.23,
    "running": 0,
    "waiting": 0,
    "running_at_start": 3,
    "metrics": True,
    "reachable": True,
    "stop": {"stop_s": 0.6},
}
ACCEPTANCE = {
    "acceptance_rate": 0.724,
    "accepted_tokens": 724,
    "draft_tokens": 1000,
    "mean_acceptance_length": 3.5,
    "tokens_per_s": 88.1,
}


def test_unchanged_and_would_redeploy():
    assert r.entry(PLANNED, {"reasons": []})["action"] == "unchanged"
    would = {
        "would_signal": [
            {"pid": 7, "comm": "VLLM::Worker_TP0", "gpus": [0], "cmdline": "x" * 100, "owner": {"agent": {"pid": 5}}}
        ]
    }
    e = r.entry(PLANNED, {"reasons": ["configuration changed"], "check_mode": True, "would_end": would})
    assert e["action"] == "would redeploy"
    assert r.summary_lines([e], ["a", "b"]) == [
        "a (GPUs 0,1, http://127.0.0.1:8000): would redeploy (configuration changed)",
        "  gpu_memory_utilization: 0.9 -> 0.85",
        "  would end 1 process(es) on its GPUs, with their vLLM API server(s) 5:",
        "    PID 7 VLLM::Worker_TP0 (GPUs 0): " + "x" * 77 + "...",
        "not attempted after the failure above: b",
    ]
    moved = dict(PLANNED, cfg=dict(NEW, gpus=[2, 3]))
    e = r.entry(moved, {"reasons": ["configuration changed"], "check_mode": True})
    assert r.summary_lines([e], ["a"])[-2:] == [
        "  would end no process on its GPUs (none holds them now)",
        "  would also stop the running server on GPUs 0,1 (its whole session)",
    ]


def test_redeployed_with_drain_leftovers_health_and_gate():
    e = r.entry(
        PLANNED,
        {
            "reasons": ["configuration changed"],
            "drain": DRAIN,
            "down_s": 12.345,
            "kill": {"signalled": [{"pid": 9, "comm": "VLLM::EngineCore"}]},
            "ready": {"healthy_after_s": 2.5},
            "acceptance": ACCEPTANCE,
        },
    )
    assert e["action"] == "redeployed" and e["down_s"] == 12.3
    assert r.summary_lines([e], ["a"])[1:] == [
        "  gpu_memory_utilization: 0.9 -> 0.85",
        "  drained in 1.2 s: 0 request(s) running and 0 waiting at the stop (3 running at the start), server exited 0.6 s after SIGTERM",
        "  ended 1 process(es) left on its GPUs: 9 VLLM::EngineCore",
        "  healthy 2.5 s after start, down 12.3 s in all",
        "  acceptance rate 72.4% (724 of 1000 draft tokens), mean acceptance length 3.50, 88.1 tok/s over the warm-up",
    ]
    assert r.failures([e], "gpu07") == ""


def test_skipped_results_are_not_reported():
    e = r.entry(
        dict(PLANNED, old=None),
        {
            "reasons": ["configuration changed", "not running"],
            "drain": {"skipped": True},
            "acceptance": {"skipped": True},
            "ready": {"healthy_after_s": 1.0},
        },
    )
    assert e["drain"] is None and e["acceptance"] is None
    assert (
        r.summary_lines([e], ["a"])[1]
        == '  configuration: none deployed by this role -> speculative_config {"method": "dflash"}'
    )


def test_failures_name_the_rollback_and_the_new_log():
    e = r.entry(
        PLANNED,
        {
            "reasons": ["configuration changed"],
            "failure": "Wait until the server is healthy: exited",
            "rollback": "rolled back to the previous configuration, healthy again after 1.0 s",
            "log_tail": {"stdout_lines": ["one", "two", "three"]},
            "log_lines": 2,
        },
    )
    assert e["action"] == "FAILED" and e["log_tail"] == ["two", "three"]
    assert r.summary_lines([e], ["a"])[-5:] == [
        "  failed at Wait until the server is healthy: exited",
        "  rolled back to the previous configuration, healthy again after 1.0 s",
        "  last lines the new server wrote to /var/log/vllm/a.log:",
        "    two",
        "    three",
    ]
    assert r.failures([e], "gpu07") == (
        "vLLM instance a on gpu07: the new configuration failed at Wait until the server is healthy: exited -- rolled back "
        "to the previous configuration, healthy again after 1.0 s. Last lines the new server wrote to /var/log/vllm/a.log:"
        "\ntwo\nthree"
    )
    quiet = r.entry(PLANNED, {"reasons": ["x"], "failure": "f", "rollback": "r", "log_tail": {}})
    assert r.failures([quiet], "h").endswith("The new server wrote nothing to /var/log/vllm/a.log.")


def test_a_failed_hook_stops_nothing():
    e = r.entry(
        PLANNED, {"reasons": ["configuration changed"], "hook_failure": "Take out: non-zero return code (rc 3)"}
    )
    assert e["before_stop"] and e["rollback"] == r.NOTHING_STOPPED
    assert r.failures([e], "h") == (
        "vLLM instance a on h: failed before anything was stopped, at Take out: non-zero "
        "return code (rc 3) -- %s." % r.NOTHING_STOPPED
    )


def test_failure_of_a_command_names_its_status_and_stderr():
    assert r.failure({"msg": "non-zero return code", "rc": 3, "stderr": "a\nbalancer refused\n"}) == (
        "non-zero return code (rc 3), stderr: a | balancer refused"
    )
    assert r.failure(None) == "failed"


def test_no_report_says_the_checks_failed():
    assert r.summary_lines([], ["a"]) == [
        "no instance was deployed: the checks above failed before anything was stopped"
    ]


def test_a_failed_rollback_shows_what_the_previous_configuration_wrote():
    # Issue 33 item 13: the previous configuration's own start error, from its log, is in the summary and the failure.
    results = {
        "reasons": ["configuration changed"],
        "failure": "Wait until the server is healthy: exited",
        "rollback": "the rollback failed too: Wait until the server is healthy: the server process (PID 9) exited",
        "log_tail": {"stdout_lines": ["new: CUDA error"]},
        "rollback_log_tail": {"stdout_lines": ["=== start", "old: error: cannot open /models/gone"]},
        "log_lines": 30,
    }
    e = r.entry(PLANNED, results)
    assert r.summary_lines([e], ["a"])[-5:] == [
        "  last lines the new server wrote to /var/log/vllm/a.log:",
        "    new: CUDA error",
        "  last lines the previous configuration wrote to /var/log/vllm/a.log when started again:",
        "    === start",
        "    old: error: cannot open /models/gone",
    ]
    assert r.failures([e], "h").endswith(
        "Last lines the new server wrote to /var/log/vllm/a.log:\nnew: CUDA error\nLast lines the previous "
        "configuration wrote to /var/log/vllm/a.log when started again:\n=== start\nold: error: cannot open /models/gone"
    )
    silent = r.entry(PLANNED, dict(results, rollback_log_tail={}))
    assert r.failures([silent], "h").endswith("The previous configuration wrote nothing to /var/log/vllm/a.log.")


def test_an_instance_that_was_not_running_has_no_downtime_and_no_null():
    # Issue 33, "Docs and words": "down 4.2 s in all" for an instance that was not running; "speculative_config null".
    first = dict(PLANNED, old=None, running=False, cfg=dict(NEW, speculative_config=None))
    e = r.entry(
        first, {"reasons": ["configuration changed", "not running"], "ready": {"healthy_after_s": 0.5}, "down_s": 4.23}
    )
    assert r.summary_lines([e], ["a"])[1:] == [
        "  configuration: none deployed by this role -> no speculative config",
        "  healthy 0.5 s after start, 4.2 s after its redeploy began (it was not running before)",
    ]
    running = dict(PLANNED, running=True, cfg=dict(NEW, speculative_config=None, max_model_len=4096))
    e = r.entry(running, {"reasons": ["configuration changed"], "ready": {"healthy_after_s": 0.5}, "down_s": 4.23})
    lines = r.summary_lines([e], ["a"])
    assert "  healthy 0.5 s after start, down 4.2 s in all" in lines, lines
    assert (
        '  speculative_config: {"method": "dflash"} -> not set' in lines and "  max_model_len: not set -> 4096" in lines
    )
    assert not any("null" in line or "None" in line for line in lines), lines
