# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""reset_gpus_plan's gpu_reset options: off unless reset_gpus_gpu_reset asks for it, its variables refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpuops.nvidia.plugins.filter import inputs

SPEC = str(Path(__file__).resolve().parents[4] / "roles" / "reset_gpus" / "meta" / "argument_specs.yml")


def test_the_guarded_reset_is_off_unless_asked_for():
    assert inputs.reset_gpus_plan({}, SPEC)["gpu_reset"] is None
    assert inputs.reset_gpus_plan({"reset_gpus_gpu_reset": False}, SPEC)["gpu_reset"] is None


def test_its_options_follow_the_selection_and_the_numbers():
    plan = inputs.reset_gpus_plan(
        {
            "reset_gpus_gpu_reset": "true",
            "reset_gpus_gpus": "0,1",
            "reset_gpus_max_used_mib": 128,
            "reset_gpus_gpu_reset_timeout": 30,
            "reset_gpus_gpu_reset_own_pid_namespace": True,
        },
        SPEC,
    )
    assert plan["refusal"] is None
    assert plan["gpu_reset"] == {
        "gpus": plan["group"]["gpus"],
        "max_used_mib": 128,
        "driver_timeout": 10,
        "reset_timeout": 30,
        "own_pid_namespace": True,
    }
    assert "reset_timeout" not in plan["kill"] and "own_pid_namespace" not in plan["kill"]


@pytest.mark.parametrize(
    "given, words",
    [
        ({"reset_gpus_gpu_reset": "maybe"}, "reset_gpus_gpu_reset must be true or false, not 'maybe'"),
        ({"reset_gpus_gpu_reset": True, "reset_gpus_gpu_reset_timeout": 0}, "reset_gpus_gpu_reset_timeout"),
        ({"reset_gpus_gpu_resett": True}, "reset_gpus_gpu_resett"),
        # The bound of gpu_reset's reset_timeout (_options.GPU): a value past an hour is a unit mix-up.
        ({"reset_gpus_gpu_reset": True, "reset_gpus_gpu_reset_timeout": 7200}, "at most 3600"),
    ],
)
def test_its_bad_variables_are_refused_by_name_before_anything_is_signalled(given, words):
    plan = inputs.reset_gpus_plan(given, SPEC)
    assert plan["refusal"].startswith("nothing was signalled") and words in plan["refusal"], plan
    assert plan["gpu_reset"] is None


@pytest.mark.parametrize(
    "narrowing", [{"reset_gpus_pids": [5]}, {"reset_gpus_match": "vllm", "reset_gpus_users": ["a"]}]
)
def test_a_gpu_reset_chosen_by_process_must_name_its_gpus(narrowing):
    """Chosen by process, a GPU reset would reach every GPU of the host that needs one, not only those processes'."""
    plan = inputs.reset_gpus_plan(dict(narrowing, reset_gpus_gpu_reset=True), SPEC)
    assert plan["refusal"].startswith("nothing was signalled: reset_gpus_gpu_reset with reset_gpus_")
    assert plan["refusal"].endswith("resets GPUs, not processes: name them in reset_gpus_gpus")
    plan = inputs.reset_gpus_plan(dict(narrowing, reset_gpus_gpu_reset=True, reset_gpus_gpus=[1]), SPEC)
    assert plan["refusal"] is None and plan["gpu_reset"]["gpus"] == plan["group"]["gpus"]
