# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vllm_acceptance and vllm_ready modules: main() against the fake_vllm server, result read from stdout."""

from __future__ import annotations

import json

import pytest

from ansible_collections.gpuops.nvidia.plugins.modules import vllm_acceptance, vllm_ready
from module_main import run_main


def run_module(capsys, module, args):
    return run_main(module, capsys, args)


def test_acceptance_passes_the_gate(capsys, fake_vllm):
    code, result = run_module(
        capsys,
        vllm_acceptance,
        {
            "url": fake_vllm.url,
            "served_model_name": "served",
            "prompts": ["a"],
            "max_tokens": 8,
            "min_acceptance_rate": 0.5,
        },
    )
    assert code == 0 and result["changed"] is False and result["acceptance_rate"] == 0.75
    assert "acceptance rate 75.0% (6 of 8 draft tokens), mean acceptance length 4.00" in result["msg"]


def test_acceptance_below_the_minimum_fails_with_the_numbers(capsys, fake_vllm):
    fake_vllm.accepted_per_draft = 0  # a drafter served with the wrong configuration: nothing accepted
    code, result = run_module(
        capsys,
        vllm_acceptance,
        {
            "url": fake_vllm.url,
            "model": "served",
            "prompts": ["a", "b"],
            "max_tokens": 4,
            "min_acceptance_rate": 0.1,
            "api_key": "secret",
        },
    )
    assert code == 1 and result["failed"] and result["acceptance_rate"] == 0.0 and result["draft_tokens"] == 32
    assert result["msg"].endswith(
        "acceptance rate 0.0%% (0 of 32 draft tokens), mean acceptance length 1.00, %s tok/s is below the "
        "minimum 10.0%%" % result["tokens_per_s"]
    )
    assert "secret" not in json.dumps(result)


def test_acceptance_without_draft_tokens_fails(capsys, fake_vllm):
    fake_vllm.complete = lambda max_tokens: {"choices": [{"text": ""}], "usage": {"completion_tokens": max_tokens}}
    code, result = run_module(capsys, vllm_acceptance, {"url": fake_vllm.url, "served_model_name": "served"})
    assert code == 1 and "no draft token was counted during the warm-up of 4 completion(s)" in result["msg"]


@pytest.mark.parametrize(
    "args, message", [({"prompts": []}, "at least one prompt"), ({"min_acceptance_rate": 1.5}, "between 0 and 1")]
)
def test_acceptance_bad_input(capsys, fake_vllm, args, message):
    code, result = run_module(
        capsys, vllm_acceptance, dict({"url": fake_vllm.url, "served_model_name": "served"}, **args)
    )
    assert code == 1 and message in result["msg"] and not fake_vllm.requests


def test_ready_module_reports_and_fails(capsys, fake_vllm):
    code, result = run_module(capsys, vllm_ready, {"url": fake_vllm.url, "served_model_name": "served", "timeout": 5})
    assert code == 0 and result["ready"] and result["changed"] is False
    assert result["msg"].endswith("ready after %.1f s" % result["elapsed_s"])
    code, result = run_module(
        capsys, vllm_ready, {"url": fake_vllm.url, "served_model_name": "served", "timeout": 0, "pid": 0}
    )
    assert (
        code == 1 and result["process_exited"] and result["msg"] == "%s: no server process is running" % fake_vllm.url
    )
    fake_vllm.health_status = 503
    code, result = run_module(capsys, vllm_ready, {"url": fake_vllm.url, "served_model_name": "served", "timeout": 0})
    assert code == 1 and not result["ready"] and result["last_error"] == "GET /health: HTTP 503"
