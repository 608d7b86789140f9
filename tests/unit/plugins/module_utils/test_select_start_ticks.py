"""_select's pid_start_ticks: a PID pinned to its start time; a reused PID is left alone, bad input refused."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _select


def holder(pid, start_ticks):
    return {
        "pid": pid,
        "start_ticks": start_ticks,
        "comm": "VLLM::Worker_TP",
        "cmdline": "VLLM::Worker_TP0",
        "gpus": [0],
    }


def split(params, holders):
    checked = _select.check_options(params)
    snapshot = {"gpus": [{"index": 0, "uuid": "GPU-0"}], "holders": holders}
    return _select.Selection.from_params(params, snapshot, checked).split(snapshot)


def test_a_pid_whose_start_time_differs_is_left_alone():
    found = split({"pids": [11, 12], "pid_start_ticks": {"11": 500, "12": 600}}, [holder(11, 500), holder(12, 900)])
    assert [h["pid"] for h in found["targets"]] == [11]
    (left,) = found["left_alone"]
    assert left["pid"] == 12 and "started at tick 900, not the one pid_start_ticks names (tick 600)" in left["reason"]
    # Without the pin the PID alone selects it.
    assert [h["pid"] for h in split({"pids": [11, 12]}, [holder(11, 500), holder(12, 900)])["targets"]] == [11, 12]


@pytest.mark.parametrize(
    "params, words",
    [
        ({"pid_start_ticks": {"11": 500}}, "pid_start_ticks needs pids"),
        ({"pids": [11], "pid_start_ticks": {"12": 500}}, "got 12: 500"),
        ({"pids": [11], "pid_start_ticks": {"11": "x"}}, "got 11: x"),
        ({"pids": [11], "pid_start_ticks": {"11": True}}, "got 11: True"),
    ],
)
def test_bad_pins_are_refused(params, words):
    with pytest.raises(_select.SelectionError, match=words):
        _select.check_options(params)
