# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/plugin_utils/_check_vllm.py: what playbooks/check_vllm.yml watches."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._check_vllm import check_vllm_plan

SPEC = {"method": "dflash", "model": "/models/d"}


@pytest.mark.parametrize(
    "host, url",
    [
        (None, "http://127.0.0.1:8000"),
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("::", "http://[::1]:8000"),
        ("10.0.0.5", "http://10.0.0.5:8000"),
        ("fe80::1", "http://[fe80::1]:8000"),
    ],
)
def test_a_watch_reaches_the_instance_where_a_check_on_the_host_does(host, url):
    instance = {"name": "a", "port": 8000, "speculative_config": SPEC, "host": host}
    watch = check_vllm_plan([instance, {"name": "plain", "port": 8001}], {})["watches"]
    assert watch == [{"name": "a", "url": url, "served_model_name": "a", "min_acceptance_rate": 0.1, "watched": True}]


def test_the_threshold_is_the_instance_s_else_the_role_s_and_0_skips():
    instances = [
        {"name": "a", "port": 1, "speculative_config": SPEC, "min_acceptance_rate": 0},
        {"name": "b", "port": 2, "speculative_config": SPEC, "served_model_name": "bee"},
    ]
    watches = check_vllm_plan(instances, {}, 0.3)["watches"]
    assert [(w["min_acceptance_rate"], w["watched"], w["served_model_name"]) for w in watches] == [
        (0, False, "a"),
        (0.3, True, "bee"),
    ]


def test_the_window_bounds_the_watch():
    plan = check_vllm_plan([], {"check_vllm_window": "2.5", "check_vllm_request_timeout": 3})
    assert (plan["problems"], plan["window"], plan["request_timeout"], plan["bound"]) == ([], 2.5, 3, 45)
    assert check_vllm_plan([], {})["bound"] == 130


@pytest.mark.parametrize("value", ["abc", "-5", "0", None, "nan", True])
def test_a_window_that_is_not_seconds_is_refused_by_name(value):
    plan = check_vllm_plan([], {"check_vllm_window": value})
    assert plan["problems"] == [
        "check_vllm_window=%s is not a number of seconds above 0 (for example check_vllm_window=60): nothing was "
        "checked" % (value,)
    ]
    assert plan["window"] is None and plan["bound"] is None
