# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/filter/reports/reports.py: one host's reset in words, the fleet's closing lines, check_gpus' lines."""

from __future__ import annotations

import copy
import json
import re

from ansible_collections.gpuops.nvidia.plugins.filter.reports import reports
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _advice, _report, _wait


def facts(used, pids, available=True):
    return {
        "driver": {"available": available, "error": None if available else "libnvidia-ml.so.1 not found"},
        "gpus": [
            {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_used_mib": used, "holder_pids": pids, "error": None}
        ],
    }


KILL = {
    "changed": True,
    "gpus": [0],
    "elapsed_s": 0.5,
    "before": facts(3000, [42]),
    "left_alone": [],
    "signalled": [{"pid": 42, "comm": "python", "gpus": [0], "signals": ["SIGTERM"], "exited_after_s": 0.2}],
}


def test_after_a_longer_wait_the_summary_is_built_with_the_modules_lines():
    wait = {"released": True, "elapsed_s": 0.3, "memory_checked": True, "after": facts(0, [])}
    result = reports.reset_gpus_result(dict(KILL, summary=["gpu_kill's own"]), wait, {}, False, 2.25, True)
    assert result["outcome"] == "released" and result["message"] == "memory released after 2.25 s more"
    assert result["summary"] == _report.summary_lines(KILL, KILL["before"], wait["after"], False, result["message"])
    assert result["summary"][-1] == "GPU 0 NVIDIA H100 80GB HBM3: 3000 -> 0 MiB used, holders 1 -> 0"
    # Where no gpu_wait slice ran after gpu_kill's, gpu_kill's own lines are printed.
    assert reports.reset_gpus_result(dict(KILL, summary=["gpu_kill's own"]), wait, {}, False, 0.3, False)[
        "summary"
    ] == ["gpu_kill's own"]


def test_a_kill_that_did_not_run_and_a_failed_wait():
    # gpu_kill refused (the role's variables): the GPUs as gpu_facts read them, the outcome failed, never None.
    result = reports.reset_gpus_result(
        {"failed": True, "msg": "nothing was signalled: x"},
        {},
        {"ansible_facts": {"nvidia": facts(3000, [42])}},
        False,
        0.0,
        False,
    )
    assert result["outcome"] == "failed" and result["message"] == "FAILED to end the holders: nothing was signalled: x"
    assert result["before"] == result["after"] and "None" not in " ".join(result["summary"])
    result = reports.reset_gpus_result({}, {}, {}, False, 0.0, False)
    assert result["summary"] == ["FAILED to end the holders: gpu_kill did not run"] and result["outcome"] == "failed"
    wait = {
        "released": False,
        "elapsed_s": 0.4,
        "msg": "not released after 0.4 s: GPU 0: 3000 MiB used",
        "after": facts(3000, []),
    }
    result = reports.reset_gpus_result(KILL, wait, {}, False, 120.0, True)
    assert (
        result["message"] == "FAILED: not released after 120.0 s: GPU 0: 3000 MiB used"
        and result["outcome"] == "failed"
    )


def test_check_mode_and_no_driver_library():
    kill = dict(
        KILL, changed=False, would_signal=[{"pid": 42, "comm": "python", "gpus": [0], "cmdline": "python x.py"}]
    )
    result = reports.reset_gpus_result(kill, {}, {}, True, 0.0, False)
    assert (
        result["outcome"] == "check"
        and result["summary"][0] == "check mode: would signal 1 process(es), nothing was signalled"
    )
    bare = dict(KILL, before=facts(None, [42], available=False))
    wait = {"released": True, "elapsed_s": 0.1, "after": facts(None, [], available=False)}
    result = reports.reset_gpus_result(bare, wait, {}, False, 0.1, True)
    assert result["outcome"] == "no_holders" and result["memory_checked"] is False
    assert "memory released" not in " ".join(result["summary"]) and "used memory not checked" in result["summary"][-2]


def _nulls(value, where="report"):
    """The paths of the null values (None) in `value`, a report."""
    if value is None:
        return [where]
    if isinstance(value, dict):
        return [path for key, item in value.items() for path in _nulls(item, "%s.%s" % (where, key))]
    if isinstance(value, list):
        return [path for number, item in enumerate(value) for path in _nulls(item, "%s[%d]" % (where, number))]
    return []


STATE = {"last_wait": {}, "total": 0.0}


def test_each_phase_s_failure_makes_a_whole_report_without_none():
    """Issue 46 item 6: every failure writes a report with outcome failed, the phase and why, and no null; the
    template before crashed on a refusal ('NoneType' object has no attribute 'driver') and left the placeholder."""
    # preflight: the role refused its variables; gpu_kill's task failed on the undefined options, gpu_facts skipped.
    refusal = "nothing was signalled: unknown variable(s) reset_gpus_gpuss (a typo?)"
    task_failed = {"failed": True, "msg": "Task failed: " + refusal}
    for check_mode in (False, True):
        result = reports.reset_gpus_result(task_failed, {}, {}, check_mode, 0.0, False, refusal)
        report = reports.reset_gpus_report(result, task_failed, STATE, "gpu07", check_mode)
        assert report["outcome"] == "failed" and report["phase"] == "preflight", report
        assert report["message"] == "FAILED%s: %s" % (" (check mode)" if check_mode else "", refusal)
        assert result["summary"] == [report["message"]] and not _nulls(report), report
        assert "gpus_before" not in report and "driver" not in report and "kill_seconds" not in report
    # stop: the host's Python lacks the NVIDIA library; gpu_facts failed too (failed_when false: no facts).
    missing = {"failed": True, "msg": "Failed to import the required Python library (nvidia-ml-py)"}
    facts_failed = {"failed": False, "failed_when_result": False, "msg": missing["msg"]}
    result = reports.reset_gpus_result(missing, {}, facts_failed, False, 0.0, False, None)
    report = reports.reset_gpus_report(result, missing, STATE, "gpu07", False)
    assert (report["outcome"], report["phase"]) == ("failed", "stop") and not _nulls(report), report
    assert report["message"] == "FAILED to end the holders: " + missing["msg"] and report["signalled"] == []
    assert "None" not in json.dumps(report) and "wait_seconds" not in report
    # free: not released in time; every figure read is there.
    wait = {"released": False, "elapsed_s": 0.4, "msg": "not released after 0.4 s: GPU 0: 3000 MiB used"}
    wait["after"] = facts(3000, [])
    state = {"last_wait": wait, "total": 120.0}
    result = reports.reset_gpus_result(KILL, wait, {}, False, 120.0, True, None)
    report = reports.reset_gpus_report(result, KILL, state, "gpu07", False)
    assert (report["outcome"], report["phase"]) == ("failed", "free") and report["wait_seconds"] == 120.0, report
    assert report["kill_seconds"] == 0.5 and report["gpus_after"] == wait["after"]["gpus"]
    assert report["driver"] == wait["after"]["driver"] and report["signalled"] == KILL["signalled"]
    # Released: no phase.
    wait = {"released": True, "elapsed_s": 0.3, "memory_checked": True, "after": facts(0, [])}
    result = reports.reset_gpus_result(KILL, wait, {}, False, 0.3, False, None)
    report = reports.reset_gpus_report(result, KILL, {"last_wait": wait, "total": 0.3}, "gpu07", False)
    assert report["outcome"] == "released" and "phase" not in report and report["gpus_before"] == KILL["before"]["gpus"]
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}\+00:00$", report["time"]), report["time"]


class Hostvars(dict):
    """hostvars as a filter sees it: host -> that host's variables."""


def test_fleet_summary_prints_the_hosts_the_role_did_not_and_sums_up():
    done = dict(KILL, released=True, summary=["signalled 1 process(es) in 0.50 s", "memory released after 0.00 s more"])
    hostvars = Hostvars(
        a={"reset_gpus_kill": done},
        b={"reset_gpus_kill": done, "reset_gpus_report_dir": "/r"},
        c={"reset_gpus_kill": {"failed": True}},
        d={},
    )
    lines = reports.reset_gpus_fleet_summary(hostvars, ["a", "b"], ["a", "b", "c", "d"], False)
    assert lines == [
        "a: signalled 1 process(es) in 0.50 s",
        "a: memory released after 0.00 s more",
        # c failed after gpu_kill: the role printed its summary; d was never reached.
        "reset_gpus summary: 4 host(s): 2 ok, 2 failed or unreachable (c, d); holders ended on 2 (a, b); "
        "2 hosts' summaries printed above (b, c)",
    ]
    unreachable = Hostvars(a={"reset_gpus_kill": {"unreachable": True, "msg": "ssh: connect refused"}})
    assert reports.reset_gpus_fleet_summary(unreachable, [], ["a"], False)[-1] == (
        "reset_gpus summary: 1 host(s): 0 ok, 1 failed or unreachable (a); no holder ended"
    )
    # Without the driver library: ok, no holder left, and the line says the memory was not read.
    blind = dict(done, wait={"memory_checked": False}, summary=["no holder left after 0.00 s more"])
    lines = reports.reset_gpus_fleet_summary(
        Hostvars(a={"reset_gpus_kill": blind}, b={"reset_gpus_kill": done}), ["a", "b"], ["a", "b"], False
    )
    assert lines[-1] == (
        "reset_gpus summary: 2 host(s): 2 ok; holders ended on 2 (a, b); used memory not read on 1 (a)"
    ), lines
    assert reports.reset_gpus_fleet_summary(Hostvars(a={}), ["a"], ["a"], True) == [
        "reset_gpus summary (check mode: nothing was signalled): 1 host(s): 1 ok; no holder would be ended; "
        "1 host's summary printed above (a)"
    ]
    both = reports.reset_gpus_fleet_summary(Hostvars(a={}, b={}), ["a", "b"], ["a", "b"], True)
    assert both[-1].endswith("; 2 hosts' summaries printed above (a, b)"), both
    # Check mode: the hosts where ending the holders would not free the GPUs (gpu_kill's would_stay) are named.
    stay = {"reset_gpus_kill": {"changed": False, "would_stay": "not free: GPU 1: 5000 MiB used, ..."}}
    lines = reports.reset_gpus_fleet_summary(Hostvars(a=stay, b={}), ["a", "b"], ["a", "b"], True)
    assert lines[-1] == (
        "reset_gpus summary (check mode: nothing was signalled): 2 host(s): 2 ok; no holder would be ended; "
        "GPUs that ending the holders would not free on 1 (a); 2 hosts' summaries printed above (a, b)"
    ), lines


def gpu(index, left=(), left_mib=0):
    return {
        "index": index,
        "released": True,
        "memory_checked": True,
        "left_alone": list(left),
        "left_alone_mib": left_mib,
    }


def test_check_lines_name_what_was_left_out_with_its_memory():
    excluded = {"pid": 7, "comm": "vllm", "reason": "excluded by name", "memory_mib": 69325}
    hostvars = Hostvars(
        free={"check_gpus_result": {"released": True, "gpus": [gpu(0), gpu(1)], "driver": {"available": True}}},
        left={"check_gpus_result": {"released": True, "gpus": [gpu(0, [excluded], 69325), gpu(1)], "driver": {}}},
        held={"check_gpus_result": {"released": False, "gpus": [gpu(0)], "msg": "not free: GPU 0: 5000 MiB used"}},
        gone={},
    )
    lines = reports.check_gpus_lines(
        hostvars, ["free", "left", "held", "gone"], {"max_used_mib": 256, "require_memory": True}
    )
    assert lines == [
        "check_gpus free: GPUs free (2 checked): no holder, used memory at most 256 MiB each",
        "check_gpus left: GPUs free (2 checked) but for what was left out: GPU 0: 69325 MiB held by PID 7 vllm "
        "(excluded by name); no other holder, the rest of each GPU's used memory at most 256 MiB",
        "check_gpus held: not free: GPU 0: 5000 MiB used",
        "check_gpus gone: check failed: no result: unreachable, or failed before the check",
        "check_gpus summary: 4 host(s): 1 free, 1 free but for what was left out (left), 1 not free (held), "
        "1 failed to check (gone)",
    ]
    # A left-alone holder without memory (an NVML monitor) changes nothing.
    monitor = {"pid": 8, "comm": "dcgm", "reason": "protected", "memory_mib": 0}
    quiet = Hostvars(h={"check_gpus_result": {"released": True, "gpus": [gpu(0, [monitor])], "driver": {}}})
    assert (
        reports.check_gpus_lines(quiet, ["h"], {})[0]
        == "check_gpus h: GPUs free (1 checked): no holder, used memory at most 256 MiB each"
    )


def held_gpu(index, holders, used_mib=75034, **extra):
    """A GPU that gpu_wait found not free, with its next step as _wait.conclude words it."""
    status = dict(
        gpu(index),
        released=False,
        memory_used_mib=used_mib,
        unexplained_mib=0,
        holders=holders,
        error=None,
        mig_uuid=None,
        memory_note=None,
        protected_mib=0,
        foreign=[],
        suspects=[],
    )
    status.update(extra)
    status["next_step"] = _advice.next_step(status, {"driver_version": "580.95.05"})
    return status


def test_check_line_says_one_next_step_that_names_the_reset_and_no_torchrun_for_vllm():
    """Issue 46 item 9: an orphaned vLLM TP=2 server. The line said per GPU "end them with gpuops.nvidia.gpu_kill; if
    they come back after being ended, stop their parent (PID 5 (VLLM::EngineCor): for example a torchrun or Ray agent,
    or a systemd unit) first"; now one next step names the command to run."""
    engine = {"pid": 5, "comm": "VLLM::EngineCor", "cmdline": "VLLM::EngineCore"}
    workers = [
        {"pid": 6 + i, "comm": "VLLM::Worker_TP", "state": "S", "parent": engine, "memory_mib": 75034} for i in (0, 1)
    ]
    result = {"released": False, "gpus": [held_gpu(0, workers[:1]), held_gpu(1, workers[1:])], "driver": {}}
    result["msg"] = "not free: " + "; ".join(_advice.describe(g) for g in result["gpus"])
    status, words = reports.check_gpus_status(result, False, 256, "gpu07", {"exclude": []})
    assert status == "not_free" and words == (
        "not free: GPU 0: 75034 MiB used, held by PID 6 VLLM::Worker_TP (state S); GPU 1: 75034 MiB used, held by "
        "PID 7 VLLM::Worker_TP (state S); next, to end them: ansible-playbook gpuops.nvidia.reset_gpus -l gpu07"
    ), words
    assert "torchrun" not in words and "Ray" not in words and "\n" not in words
    # The check's own selection goes with the command; a torchrun parent is named; a GPU that a reset cannot free
    # keeps its own next step.
    torchrun = {"pid": 40, "comm": "torchrun", "cmdline": "/usr/bin/python3 /usr/local/bin/torchrun train.py"}
    trainer = {"pid": 41, "comm": "python3", "state": "S", "parent": torchrun, "memory_mib": 1000}
    leaked = held_gpu(2, [], used_mib=3000, unexplained_mib=3000, unexplained_cause="leaked")
    result = {"released": False, "gpus": [held_gpu(1, [trainer]), leaked], "driver": {}, "msg": "x"}
    result["left_alone"] = [{"pid": 9, "comm": "vllm", "reason": "excluded by name"}]
    _status, words = reports.check_gpus_status(result, False, 256, "gpu 8", {"gpus": [1, 2], "exclude": ["vllm"]})
    assert words.startswith(
        "not free: GPU 1: 75034 MiB used, held by PID 41 python3 (state S); GPU 2: 3000 MiB used"
    ), words
    assert (
        "GPU 2: 3000 MiB used, 3000 MiB that no listed process explains, no selected holder; next: memory is used"
        in (words)
    )
    assert words.endswith(
        "; next for GPU 1, to end them: ansible-playbook gpuops.nvidia.reset_gpus -l 'gpu 8' -e "
        '\'{"reset_gpus_gpus": [1, 2], "reset_gpus_exclude": ["vllm"]}\'; if they come back after being ended, stop '
        "their parent (PID 40 (torchrun): a torchrun agent) first; left alone: PID 9 (vllm, excluded by name)"
    ), words


def test_check_lines_without_memory_read():
    unread = dict(gpu(None), memory_checked=False)
    result = {"released": True, "gpus": [unread], "driver": {"error": "libnvidia-ml.so.1 not found"}}
    status, words = reports.check_gpus_status(copy.deepcopy(result), False, 256)
    assert (
        status == "not_checked"
        and "used memory of every GPU not read" in words
        and "check_gpus_allow_proc_only=true" in words
    )
    status, words = reports.check_gpus_status(result, True, 256)
    assert status == "no_holders" and words.startswith("used memory of every GPU not read")
    assert words.endswith("no process holds them (/proc scan); accepted by check_gpus_allow_proc_only"), words


def test_check_line_names_the_memory_left_out_first_and_who_holds_it():
    """check_gpus_exclude's holder with 60000 MiB: the line leads with that memory and its holder; "used memory at
    most 256 MiB each" is never said of a GPU that holds it (issue 33, item 6)."""
    excluded = {"pid": 7, "comm": "vllm-serve", "reason": "excluded by name", "memory_mib": 60000}
    daemon = {"pid": 9, "comm": "nvidia-persistenced", "reason": "protected GPU daemon", "memory_mib": 12}
    result = {"released": True, "gpus": [gpu(0, [excluded, daemon], 60012), gpu(1)], "driver": {"available": True}}
    status, words = reports.check_gpus_status(result, False, 256)
    assert status == "free_left_out" and "used memory at most 256 MiB each" not in words, words
    assert words == (
        "GPUs free (2 checked) but for what was left out: GPU 0: 60012 MiB held by PID 7 vllm-serve (excluded by "
        "name, 60000 MiB), PID 9 nvidia-persistenced (protected GPU daemon, 12 MiB); no other holder, the rest of "
        "each GPU's used memory at most 256 MiB"
    )


def test_check_line_on_memory_info_v1_says_reserved_memory_is_included():
    """Without NVML memory info v2, used memory includes reserved memory: the line says the bound it was held to,
    reserved memory included, not "at most 256 MiB" (issue 33, item 4)."""
    v1 = dict(gpu(0), reserved_allowance_mib=1024)
    status, words = reports.check_gpus_status({"released": True, "gpus": [v1], "driver": {"available": True}}, 0, 256)
    assert status == "free" and "at most 256 MiB each" not in words, words
    assert words == (
        "GPUs free (1 checked): no holder, used memory at most 1280 MiB each, reserved memory included (NVML memory "
        "info v1 cannot tell it apart: 256 MiB and up to 1024 MiB of reserved memory)"
    )


def test_memory_the_driver_does_not_report_is_not_checked():
    """A GB10: NVML answers NOT_SUPPORTED for memory, the library works. Without a figure the check fails as "not
    checked" (or, accepted, says no figure), and a reset's report never says memory_checked (issue 33, item 5)."""
    unread = dict(gpu(0), memory_checked=False)
    result = {"released": True, "gpus": [unread], "driver": {"available": True, "error": None}}
    status, words = reports.check_gpus_status(copy.deepcopy(result), False, 256)
    assert status == "not_checked" and "not reported by the driver" in words and "MiB" not in words, words
    status, words = reports.check_gpus_status(result, True, 256)
    assert status == "no_holders" and "MiB" not in words and "(the driver's process lists and /proc)" in words, words

    def gb10(used, pids):
        view = facts(used, pids)
        view["gpus"][0].update(name="NVIDIA GB10", memory_source="process_lists", memory_supported=False)
        return view

    kill = dict(KILL, before=gb10(60043, [42]))
    wait = {
        "released": True,
        "elapsed_s": 0.1,
        "memory_checked": False,
        "driver": {"available": True},
        "after": gb10(0, []),
    }
    result = reports.reset_gpus_result(kill, wait, {}, False, 0.1, True)
    assert result["memory_checked"] is False and result["outcome"] == "no_holders", result
    assert (
        result["message"] == "no holder left after 0.10 s more; used memory not checked (the driver does not report it)"
    )
    assert result["summary"][-1] == (
        "GPU 0 NVIDIA GB10: used memory not reported by the driver (its process lists charge 60043 -> 0 MiB), "
        "holders 1 -> 0"
    )
    # Check mode (no wait): the facts alone say the memory is not reported.
    check = reports.reset_gpus_result(dict(KILL, before=gb10(0, []), would_signal=[]), {}, {}, True, 0.0, False)
    assert check["memory_checked"] is False and check["outcome"] == "check"


def test_a_refused_reset_names_no_gpu_it_did_not_select():
    """gpu_kill refused before it selected anything (a bad regex with GPU 3 asked for): the summary is the refusal,
    not the used memory of every GPU of the host that gpu_facts read."""
    every = facts(0, [])
    every["gpus"] = [dict(every["gpus"][0], index=i) for i in range(8)]
    refused = {"failed": True, "msg": "nothing was signalled: match: invalid regex"}
    result = reports.reset_gpus_result(refused, {}, {"ansible_facts": {"nvidia": every}}, False, 0.0, False)
    assert result["summary"] == ["FAILED to end the holders: nothing was signalled: match: invalid regex"]
    assert result["outcome"] == "failed" and result["after"] == every


# --- where the wait stands, and its line of progress (issue 34 item 4: out of roles/reset_gpus/vars/main.yml) -------

HELD = {"index": 1, "released": False, "memory_used_mib": 5000, "holders": [], "error": None, "protected_mib": 0}
LOST = {"index": 0, "released": False, "memory_used_mib": None, "holders": [{"pid": 7}], "error": "GPU is lost"}
SLICE = {"released": False, "elapsed_s": 15.0, "driver": {"timed_out": False}, "gpus": [HELD]}


def test_the_last_slice_is_gpu_waits_else_gpu_kills_own_else_none():
    kill = {"released": False, "wait": dict(SLICE, elapsed_s=14.0), "after": {"gpus": []}}
    state = reports.reset_gpus_state(kill, {}, 120)
    assert state["last_wait"] == dict(kill["wait"], released=False, after={"gpus": []})
    assert state["total"] == 14.0 and state["more"] is True and not state["finished"]
    # A skipped gpu_wait (no "released") did not wait.
    assert reports.reset_gpus_state(kill, {"skipped": True}, 120)["total"] == 14.0
    # gpu_wait's elapsed_s counts all its slices: the total is gpu_kill's slice and gpu_wait's whole wait.
    state = reports.reset_gpus_state(kill, dict(SLICE, elapsed_s=31.5), "120")
    assert state["last_wait"] == dict(SLICE, elapsed_s=31.5) and state["total"] == 45.5
    assert reports.reset_gpus_state({}, None, 120) == {
        "last_wait": {},
        "total": 0.0,
        "first_slice": {},
        "left_s": 120.0,
        "more": False,
        "finished": False,
    }


def test_whether_and_how_long_gpu_wait_goes_on_come_from_gpu_kills_slice_alone():
    """The tasks before gpu_wait read "more", "left_s" and the line of progress while reset_gpus_wait may still be an
    earlier run's of the role on this host (a play that runs the role twice): that wait changes none of them."""
    kill = {"released": False, "wait": dict(SLICE, elapsed_s=5.0)}
    fresh = reports.reset_gpus_state(kill, {}, 120)
    for earlier in (dict(SLICE, released=True, elapsed_s=17.0), dict(SLICE, elapsed_s=110.0)):
        state = reports.reset_gpus_state(kill, earlier, 120)
        assert (state["more"], state["left_s"]) == (fresh["more"], fresh["left_s"]) == (True, 115.0), earlier
        assert reports.reset_gpus_progress(state, 120) == reports.reset_gpus_progress(fresh, 120)
    assert reports.reset_gpus_progress(fresh, 120).startswith("still held after 5 s of 120 s: GPU 1 5000 MiB used")


def test_gpu_wait_goes_on_only_while_it_can_help_and_time_is_left():
    kill = {"released": False, "wait": SLICE}
    assert reports.reset_gpus_state(kill, {}, 120)["more"] is True
    for wait in (
        dict(SLICE, released=True),
        dict(SLICE, driver={"timed_out": True}),
        dict(SLICE, gpus=[LOST]),
        dict(SLICE, elapsed_s=0),
        dict(SLICE, elapsed_s=120),
    ):
        assert reports.reset_gpus_state({"released": wait["released"], "wait": wait}, {}, 120)["more"] is False, wait
        # The same decision as gpu_wait's between its own slices (one function).
        assert _wait.worth_another_slice(wait, float(wait["elapsed_s"]), 120) is False, wait


def test_finished_where_gpu_kill_released_and_nothing_is_left_to_write():
    assert reports.reset_gpus_state({"released": True, "wait": {}}, {}, 120, "")["finished"] is True
    assert reports.reset_gpus_state({"released": True, "wait": {}}, {}, 120, "/tmp/r")["finished"] is False
    assert reports.reset_gpus_state({"released": False, "wait": {}}, {}, 120)["finished"] is False


def test_the_line_of_progress_names_each_gpu_still_held():
    protected = dict(HELD, index=None, holders=[{"pid": 4}, {"pid": 5}], protected_mib=300, memory_used_mib=None)
    kill = {"released": False, "wait": dict(SLICE, gpus=[HELD, LOST, protected, dict(HELD, released=True)])}
    state = reports.reset_gpus_state(kill, {}, 120)
    # gpu_wait's timeout for the rest, whole milliseconds: the line says the same.
    assert state["left_s"] == 105.0 and reports.reset_gpus_state(kill, {}, "104.9876")["left_s"] == 89.987
    held = (
        "GPU 1 5000 MiB used, held by no selected process; GPU 0 used memory unknown (GPU is lost), held by 7; all GPUs "
        "used memory unknown, held by 4, 5, 300 MiB by protected holders"
    )
    # After gpu_kill's slice: how long gpu_wait may go on, within which its own lines count.
    assert (
        reports.reset_gpus_progress(state, 120) == "still held after 15 s of 120 s: %s; waiting up to 105 s more" % held
    )
    assert (
        reports.reset_gpus_progress(reports.reset_gpus_state(kill, {}, "1.5"), "1.5")
        == "still held after 15 s of 1.5 s: %s; waiting up to 0 s more" % held
    )
    # The GPUs in the words of gpu_wait's lines between its slices (_report.progress_line).
    assert (
        _report.progress_line(state["last_wait"]["gpus"], 15.0, 105.0) == "still waiting after 15 s of 105 s: " + held
    )


RESET = {"changed": True, "gpus": [0, 1], "msg": "reset GPU 0, 1: stop nvidia-persistenced.service; ..."}


def test_the_look_after_a_gpu_reset_is_the_last_and_a_gpu_reset_leaves_the_reset_unfinished():
    kill = {"released": False, "wait": dict(SLICE, elapsed_s=1.0), "after": {"gpus": []}}
    check = {"released": True, "elapsed_s": 0.25, "after": facts(0, []), "gpus": [dict(HELD, released=True)]}
    state = reports.reset_gpus_state(kill, {}, 120, "", True, check, RESET)
    assert state["last_wait"] == check and state["total"] == 1.25
    # What gpu_wait would wait for is decided before the GPU reset, on gpu_kill's slice.
    assert state["more"] is True and state["left_s"] == 119.0
    assert reports.reset_gpus_state(kill, {}, 120, "", True, {"skipped": True}, RESET)["last_wait"]["released"] is False
    # A look this run did not take (no GPU reset ran, it failed, or the kill failed) is an earlier run's: not used.
    for gpu_reset, this_kill in (({}, kill), (dict(RESET, failed=True), kill), (RESET, dict(kill, failed=True))):
        stale = reports.reset_gpus_state(this_kill, {}, 120, "", True, check, gpu_reset)
        assert stale["last_wait"]["released"] is False and stale["total"] == 1.0, (gpu_reset, this_kill)
    # Released in gpu_kill's slice: the GPU reset may still be due (the driver's advice), so the role goes on.
    assert reports.reset_gpus_state({"released": True, "wait": {}}, {}, 120, "", True)["finished"] is False


def test_a_gpu_reset_that_freed_the_gpus_is_no_failure_and_says_so():
    check = {"released": True, "elapsed_s": 0.25, "memory_checked": True, "after": facts(0, [])}
    result = reports.reset_gpus_result(dict(KILL, summary=["own"]), check, {}, False, 1.25, True, None, RESET)
    assert result["outcome"] == "released" and result["phase"] is None
    assert result["message"] == "memory released after 1.25 s more; GPU 0, 1 were reset (reset_gpus_gpu_reset)"
    assert result["message"] in result["summary"] and not any("FAILED" in line for line in result["summary"])
    # gpu_kill's own lines never stand for a run whose GPU reset ran.
    result = reports.reset_gpus_result(dict(KILL, summary=["own"]), check, {}, False, 0.3, False, None, RESET)
    assert result["summary"] != ["own"] and result["message"].endswith("GPU 0, 1 were reset (reset_gpus_gpu_reset)")
    one = dict(RESET, gpus=[1])
    assert reports.reset_gpus_result(KILL, check, {}, False, 1.0, True, None, one)["message"].endswith(
        "; GPU 1 was reset (reset_gpus_gpu_reset)"
    )
    check_mode = reports.reset_gpus_result(dict(KILL, would_signal=[]), {}, {}, True, 0.0, False, None, RESET)
    assert check_mode["outcome"] == "check" and check_mode["message"] == (
        "check mode: would signal 0 process(es), nothing was signalled; GPU 0, 1 would be reset (reset_gpus_gpu_reset)"
    )
    # A GPU reset that reset nothing, or that did not run, changes no word.
    for nothing in ({"changed": False, "gpus": []}, {"skipped": True}, {}):
        assert reports.reset_gpus_result(KILL, check, {}, False, 1.0, True, None, nothing)["message"] == (
            "memory released after 1.00 s more"
        )


def test_a_refused_gpu_reset_fails_the_host_in_its_own_phase_with_its_words():
    held = dict(SLICE, msg="not released after 1.0 s: GPU 1: 5000 MiB used", memory_checked=True, after=facts(5000, []))
    refused = {"failed": True, "changed": False, "gpus": [1], "msg": "gpu_reset refused, nothing was changed: x"}
    result = reports.reset_gpus_result(KILL, held, {}, False, 1.0, True, None, refused)
    assert result["outcome"] == "failed" and result["phase"] == "free"
    assert result["message"] == (
        "FAILED: not released after 1.0 s: GPU 1: 5000 MiB used; gpu_reset refused, nothing was changed: x"
    ), result["message"]
    # Released, yet the GPU reset the driver asked for failed: the host failed in the GPU reset's phase.
    released = {"released": True, "elapsed_s": 0.2, "memory_checked": True, "after": facts(0, [])}
    result = reports.reset_gpus_result(KILL, released, {}, False, 0.2, False, None, refused)
    assert result["outcome"] == "failed" and result["phase"] == "gpu_reset"
    assert result["message"] == "FAILED: gpu_reset refused, nothing was changed: x (memory released after 0.20 s more)"
    result = reports.reset_gpus_result(dict(KILL, would_signal=[]), {}, {}, True, 0.0, False, None, refused)
    assert result["outcome"] == "failed" and result["message"] == (
        "FAILED (check mode): gpu_reset refused, nothing was changed: x (check mode: would signal 0 process(es), "
        "nothing was signalled)"
    )
    # After a failed kill no GPU reset ran: a result of one is an earlier run's, and says nothing here.
    failed_kill = {"failed": True, "msg": "nothing was signalled: x"}
    result = reports.reset_gpus_result(failed_kill, {}, {}, False, 0.0, False, None, RESET)
    assert result["phase"] == "stop" and result["message"] == "FAILED to end the holders: nothing was signalled: x"
    # A kill that did not run (its tag not asked for) counts as failed, yet the GPU reset ran: the words say so.
    result = reports.reset_gpus_result({}, {}, {}, False, 0.0, False, None, RESET)
    assert result["message"].endswith("; GPU 0, 1 were reset (reset_gpus_gpu_reset)"), result["message"]


def test_the_fleet_summary_counts_the_gpu_resets_and_leaves_their_hosts_summaries_to_the_role():
    done = dict(KILL, released=True, summary=["signalled 1 process(es) in 0.50 s"])
    hostvars = Hostvars(
        a={"reset_gpus_kill": done, "reset_gpus_gpu_reset": "true", "_reset_gpus_gpu_reset": RESET},
        b={"reset_gpus_kill": done, "reset_gpus_gpu_reset": True, "_reset_gpus_gpu_reset": {"changed": False}},
        c={"reset_gpus_kill": done, "_reset_gpus_gpu_reset": dict(RESET, failed=True)},
    )
    lines = reports.reset_gpus_fleet_summary(hostvars, ["a", "b"], ["a", "b", "c"], False)
    assert lines == [
        "reset_gpus summary: 3 host(s): 2 ok, 1 failed or unreachable (c); holders ended on 3 (a, b, c); "
        "GPUs reset on 1 (a); 3 hosts' summaries printed above (a, b, c)"
    ], lines
    check = reports.reset_gpus_fleet_summary(Hostvars(a=dict(hostvars["a"])), ["a"], ["a"], True)
    assert "; GPUs would be reset on 1 (a);" in check[-1], check
