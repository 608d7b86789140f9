# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpu_wait's wait in slices (plugins/action/gpu_wait.py, option progress_interval) with a fake module run; the
decision between two slices (_wait.worth_another_slice) and the words of the whole time (_wait.whole_time). The runs
on a simulated node are in tests/integration/test_reset_gpus.py and test_role_inputs.py (the reset_gpus role)."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

from ansible_collections.gpuops.nvidia.plugins.action import gpu_wait as action
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _report, _wait
from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _interpreter

HELD = {"index": 1, "released": False, "memory_used_mib": 5000, "holders": [{"pid": 9}], "error": None}
FREE = {"index": 1, "released": True, "memory_used_mib": 3, "holders": [], "error": None}
DRIVER = {"available": True, "timed_out": False, "error": None}


def held(seconds, msg=None, **extra):
    """A slice that ran to its timeout `seconds` with GPU 1 still held (as gpu_wait fails then)."""
    return dict(
        {
            "failed": True,
            "released": False,
            "elapsed_s": seconds,
            "polls": 3,
            "gpus": [HELD],
            "driver": DRIVER,
            "msg": msg or "not released after %.1f s: GPU 1: 5000 MiB used, held by PID 9" % seconds,
        },
        **extra,
    )


def released(seconds):
    return {
        "released": True,
        "elapsed_s": seconds,
        "polls": 2,
        "gpus": [FREE],
        "driver": DRIVER,
        "msg": "released after %.2f s" % seconds,
    }


class FakeModule:
    """The module's runs: `answer(timeout)` gives each run's result; `timeouts` records the timeout of each run.
    `now` is the controller's clock (`clock`): each run moves it by the seconds the run reports waiting and by
    `start_s`, the time a module run takes to start and end."""

    def __init__(self, answer, start_s=0.0):
        self.answer = answer
        self.timeouts = []
        self.now = 1000.0
        self.start_s = start_s

    def __call__(self, seconds):
        self.timeouts.append(seconds)
        result = self.answer(seconds)
        self.now += float(result.get("elapsed_s") or 0) + self.start_s
        return result

    def clock(self):
        return self.now


def wait(module, timeout_s, interval_s, show):
    return action.wait_in_slices(module, timeout_s, interval_s, show, module.clock)


def test_slices_until_the_timeout_with_a_line_between_two():
    module, lines = FakeModule(held), []
    result = wait(module, 10.0, 4.0, lines.append)
    # 4 + 4 + 2 s: the timeouts sum to the whole timeout, the last one is the time left.
    assert module.timeouts == [4.0, 4.0, 2.0]
    assert lines == [
        "still waiting after 4 s of 10 s: GPU 1 5000 MiB used, held by 9",
        "still waiting after 8 s of 10 s: GPU 1 5000 MiB used, held by 9",
    ]
    assert result["elapsed_s"] == 10.0 and result["polls"] == 9 and result["slices"] == 3
    assert result["failed"] and result["released"] is False
    # The message names the whole time waited, not the last slice's 2 s.
    assert result["msg"] == "not released after 10.0 s: GPU 1: 5000 MiB used, held by PID 9"


def test_the_controller_s_clock_bounds_the_wait_module_starts_included():
    # Each run takes 1 s to start and end: 4 + 1, then 4 + 1 s, and the time is up. The wait says 10 s, not 8.
    module, lines = FakeModule(held, start_s=1.0), []
    result = wait(module, 10.0, 4.0, lines.append)
    assert module.timeouts == [4.0, 4.0] and result["slices"] == 2 and result["elapsed_s"] == 10.0
    assert lines == ["still waiting after 5 s of 10 s: GPU 1 5000 MiB used, held by 9"]
    assert result["msg"] == "not released after 10.0 s: GPU 1: 5000 MiB used, held by PID 9"


def test_a_tiny_interval_is_bounded_by_the_timeout_not_by_the_number_of_slices():
    # 0.01 s slices that take 0.7 s each to run: a few slices, not 200, and never past the timeout by more than one.
    module = FakeModule(held, start_s=0.7)
    result = wait(module, 2.0, 0.01, lambda line: None)
    assert result["slices"] == 3 and 2.0 <= result["elapsed_s"] <= 2.0 + 0.71
    assert all(seconds <= 0.01 for seconds in module.timeouts)


def test_the_whole_time_replaces_the_last_slice_s_exception_summary():
    # ansible-core 2.19 and later print a failure's "exception" summary instead of its msg.
    module = FakeModule(lambda seconds: held(seconds, exception={"msg": "not released after %.1f s" % seconds}))
    result = wait(module, 6.0, 4.0, lambda line: None)
    assert result["msg"].startswith("not released after 6.0 s") and "exception" not in result


def test_the_release_ends_the_wait_and_its_message_names_the_whole_time():
    answers = iter([held(4.0), released(1.25)])
    module, lines = FakeModule(lambda seconds: next(answers)), []
    result = wait(module, 60.0, 4.0, lines.append)
    assert module.timeouts == [4.0, 4.0] and len(lines) == 1
    assert result["released"] is True and result["elapsed_s"] == 5.25 and result["polls"] == 5
    assert result["slices"] == 2 and result["msg"] == "released after 5.25 s"
    assert "failed" not in result


def test_an_interval_as_long_as_the_timeout_is_one_run():
    module, lines = FakeModule(held), []
    result = wait(module, 3.0, 5.0, lines.append)
    assert module.timeouts == [3.0] and lines == [] and result["slices"] == 1
    assert result["msg"] == held(3.0)["msg"]


@pytest.mark.parametrize(
    "last",
    [
        held(4.0, driver=dict(DRIVER, timed_out=True), msg="NVML did not answer within driver_timeout (10 s)"),
        held(0.5, gpus=[dict(HELD, error="GPU is lost")]),
        # Ended before its timeout without a release: only protected holders keep the GPU (nothing ends them).
        held(0.02),
    ],
    ids=["hung driver", "lost GPU", "ended early"],
)
def test_a_slice_after_which_waiting_cannot_help_ends_the_wait_at_once(last):
    module, lines = FakeModule(lambda seconds: last), []
    result = wait(module, 60.0, 4.0, lines.append)
    assert module.timeouts == [4.0] and lines == [] and result["slices"] == 1
    assert result["msg"] == last["msg"]


def test_a_refused_or_unreachable_run_is_returned_as_it_is():
    refused = {"failed": True, "msg": "invalid option value: max_used_mib=-1 (must not be negative)"}
    module = FakeModule(lambda seconds: refused)
    assert wait(module, 60.0, 4.0, print) == dict(refused, slices=1)
    assert module.timeouts == [4.0]


def test_a_module_whose_slices_take_no_time_still_ends():
    # A slice that reports 0 s waited ends the wait (worth_another_slice): no endless loop.
    module = FakeModule(lambda seconds: held(0.0))
    assert wait(module, 60.0, 4.0, print)["slices"] == 1


@pytest.mark.parametrize(
    "args, plan",
    [
        ({}, None),
        ({"progress_interval": 0}, None),
        ({"progress_interval": None}, None),
        ({"progress_interval": 5}, (60.0, 5.0)),
        ({"progress_interval": "2.5", "timeout": "30"}, (30.0, 2.5)),
        # Values the module refuses: one run, which fails with the module's own words before anything waits.
        ({"progress_interval": -1}, None),
        ({"progress_interval": "nan"}, None),
        ({"progress_interval": 3601}, None),
        ({"progress_interval": "often"}, None),
        ({"progress_interval": 5, "timeout": 1e308}, None),
        ({"progress_interval": 5, "timeout": -1}, None),
    ],
)
def test_slice_plan(args, plan):
    assert action.slice_plan(args) == plan


# --- the action plugin around the loop ------------------------------------------------------------------------------


def plugin(args, delegate_to=None):
    task = SimpleNamespace(
        resolved_action="gpuops.nvidia.gpu_wait", action="gpuops.nvidia.gpu_wait", args=args, delegate_to=delegate_to
    )
    return action.ActionModule(task, *(mock.MagicMock() for _part in range(5)))


@pytest.fixture
def runs(monkeypatch):
    """The module runs of the interpreter's _execute_module: the arguments of each; every run ends with GPU 1 held."""
    seen = []
    clock = SimpleNamespace(now=0.0)

    def run(self, module_name=None, module_args=None, tmp=None, task_vars=None, **kwargs):
        seen.append(module_args)
        clock.now += float((module_args or {}).get("timeout", 60.0))
        return held(float((module_args or {}).get("timeout", 60.0)))

    monkeypatch.setattr(_interpreter.ActionModule, "_execute_module", run)
    # The controller's clock moves as the runs wait (gpu_wait.py reads time.monotonic).
    monkeypatch.setattr(action, "time", SimpleNamespace(monotonic=lambda: clock.now))
    return seen


def test_the_plugin_runs_the_module_per_slice_and_prints_each_line_with_the_host(runs, monkeypatch):
    shown = []
    monkeypatch.setattr(action.display, "display", lambda msg, *a, **k: shown.append(msg))
    args = {"timeout": 9, "progress_interval": 4, "gpus": [1]}
    result = plugin(args)._execute_module(task_vars={"inventory_hostname": "node1"})
    assert [run["timeout"] for run in runs] == [4.0, 4.0, 1.0]
    assert all(run["progress_interval"] == 0.0 and run["gpus"] == [1] for run in runs)
    assert len({id(run) for run in runs}) == 3 and args == {"timeout": 9, "progress_interval": 4, "gpus": [1]}
    assert shown == [
        "[node1] still waiting after 4 s of 9 s: GPU 1 5000 MiB used, held by 9",
        "[node1] still waiting after 8 s of 9 s: GPU 1 5000 MiB used, held by 9",
    ]
    assert result["elapsed_s"] == 9.0 and result["slices"] == 3 and result["msg"].startswith("not released after 9.0 s")
    shown.clear()
    plugin({"timeout": 5, "progress_interval": 4}, delegate_to="gpu2")._execute_module(
        task_vars={"inventory_hostname": "node1"}
    )
    assert shown[0].startswith("[node1 -> gpu2] still waiting after 4 s of 5 s")


def test_progress_interval_0_is_one_run_with_the_arguments_as_given(runs, monkeypatch):
    shown = []
    monkeypatch.setattr(action.display, "display", lambda msg, *a, **k: shown.append(msg))
    for args in ({"timeout": 9}, {"timeout": 9, "progress_interval": 0}, {"progress_interval": -2}):
        runs.clear()
        result = plugin(args)._execute_module(task_vars={"inventory_hostname": "node1"})
        assert runs == [None] and "slices" not in result and shown == []
    # An async task's run, or another module's, is one run too.
    runs.clear()
    plugin({"progress_interval": 4})._execute_module(task_vars={}, wrap_async=True)
    plugin({"progress_interval": 4})._execute_module("ansible.builtin.stat", {"path": "/"}, task_vars={})
    assert runs == [None, {"path": "/"}]


def test_a_null_selection_is_still_refused_before_any_run(runs):
    result = plugin({"gpus": None, "progress_interval": 4}).run(task_vars={})
    assert result["failed"] and result["msg"].startswith("gpus is null") and runs == []


# --- one decision, one wording -------------------------------------------------------------------------------------


def test_worth_another_slice():
    last = held(4.0)
    assert _wait.worth_another_slice(last, 4.0, 10.0) and _wait.worth_another_slice(last, 4.0, 10.0, 4.0)
    assert not _wait.worth_another_slice(last, 10.0, 10.0)  # no time left
    assert not _wait.worth_another_slice(last, 4.0, 10.0, 5.0)  # ended a second before its timeout
    assert _wait.worth_another_slice(dict(last, elapsed_s=3.9995), 4.0, 10.0, 4.0)  # rounded to a millisecond
    assert not _wait.worth_another_slice(released(1.0), 1.0, 10.0)
    assert not _wait.worth_another_slice({}, 0.0, 10.0)  # no wait ran
    assert not _wait.worth_another_slice(dict(last, gpus=[FREE, dict(HELD, error="GPU is lost")]), 4.0, 10.0)
    assert _wait.worth_another_slice(dict(last, gpus=[HELD, dict(HELD, error="GPU is lost")]), 4.0, 10.0)


def test_whole_time_replaces_the_time_of_a_slice_and_leaves_other_messages():
    assert _wait.whole_time("not released after 2.0 s: GPU 1: 5000 MiB used", 12.345) == (
        "not released after 12.3 s: GPU 1: 5000 MiB used"
    )
    assert _wait.whole_time("released after 0.52 s; left alone: PID 4 (x, y)", 4.5) == (
        "released after 4.50 s; left alone: PID 4 (x, y)"
    )
    assert _wait.whole_time("no holder left (memory not checked: no driver) after 0.10 s", 8) == (
        "no holder left (memory not checked: no driver) after 8.00 s"
    )
    for unchanged in ("not free: GPU 1: 5000 MiB used", "NVML did not answer within driver_timeout (10 s)"):
        assert _wait.whole_time(unchanged, 8) == unchanged
    # The role's sentence after the reset is built with the same function.
    assert _report.outcome({}, {"msg": "not released after 2.0 s: GPU 1"}, False, 17.5) == (
        "FAILED: not released after 17.5 s: GPU 1"
    )


def test_progress_line():
    lost = {"index": 0, "released": False, "memory_used_mib": None, "holders": [], "error": "GPU is lost"}
    assert _report.progress_line([HELD, FREE, lost], 29.6, 120.0) == (
        "still waiting after 30 s of 120 s: GPU 1 5000 MiB used, held by 9; GPU 0 used memory unknown (GPU is lost), "
        "held by no selected process"
    )
    assert _report.progress_line(None, 0, "1.5") == "still waiting after 0 s of 1.5 s: "
    # The reset_gpus role's rest of its wait (whole milliseconds) reads in whole seconds, a tenth below 10 s.
    assert _report.progress_line(None, 5, 115.995) == "still waiting after 5 s of 116 s: "
    assert _report.progress_line(None, 1, 3.563) == "still waiting after 1 s of 3.6 s: "
    # Half up, as one reads it (not Python's round half to even: 30.5 -> 30, 0.25 -> 0.2).
    assert _report.progress_line(None, 5, 30.5) == "still waiting after 5 s of 31 s: "
    assert _report.progress_line(None, 0, 0.25) == "still waiting after 0 s of 0.3 s: "


def test_first_progress_line_rounds_the_rest_and_keeps_the_timeout_as_given():
    line = _report.first_progress_line([HELD], 4.2, 120, 115.995)
    assert line == "still held after 4 s of 120 s: GPU 1 5000 MiB used, held by 9; waiting up to 116 s more"
    assert _report.first_progress_line(None, 0, "1.5", 1.097).endswith("of 1.5 s: ; waiting up to 1.1 s more")


def test_one_slice_s_message_and_elapsed_s_agree_on_the_controller_s_clock():
    # One slice (the interval is the whole timeout) that took 1 s to start: 3 + 1 s in both.
    module = FakeModule(held, start_s=1.0)
    result = wait(module, 3.0, 5.0, lambda line: None)
    assert result["slices"] == 1 and result["elapsed_s"] == 4.0
    assert result["msg"].startswith("not released after 4.0 s:")
