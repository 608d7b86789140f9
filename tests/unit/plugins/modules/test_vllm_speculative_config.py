# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The vllm_speculative_config module end to end: main() with module args, result read from stdout."""

from __future__ import annotations

import json
import pathlib

import pytest

from ansible_collections.gpuops.nvidia.plugins.modules import vllm_speculative_config
from module_main import run_main

DRAFTERS = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "drafters"
DFLASH = str(DRAFTERS / "dflash-qwen3")


def run_module(capsys, args):
    return run_main(vllm_speculative_config, capsys, args)


@pytest.mark.parametrize("check_mode", [False, True])
def test_corrected_dflash_config(capsys, check_mode):
    code, result = run_module(
        capsys,
        {
            "speculative_config": {
                "method": "dflash",
                "model": DFLASH,
                "target_layer_ids": [1, 16, 31, 46, 61],
                "mask_token_id": 248070,
            },
            "vllm_version": "0.33.0",
            "_ansible_check_mode": check_mode,
        },
    )
    assert code == 0 and result["changed"] is False and "failed" not in result
    assert result["speculative_config_json"] == '{"method":"dflash","model":"%s","num_speculative_tokens":15}' % DFLASH
    assert result["environment"] == {"VLLM_USE_V2_MODEL_RUNNER": "1"} and result["vllm_version"] == "0.33.0"
    assert result["filled"] == ["num_speculative_tokens"]
    assert result["drafter_config"] == DFLASH + "/config.json"
    assert "warnings" not in result


def test_guessed_dflash_config_fails_field_by_field(capsys):
    code, result = run_module(
        capsys,
        {
            "speculative_config": {
                "method": "dflash",
                "model": DFLASH,
                "num_speculative_tokens": 15,
                "target_layer_ids": [1, 17, 33, 49, 63],
                "mask_token_id": 248064,
                "layer_types": "full_attention",
            }
        },
    )
    assert code == 1 and result["failed"] is True
    assert [m["field"] for m in result["mismatches"]] == ["target_layer_ids", "mask_token_id", "layer_types"]
    lines = result["msg"].splitlines()
    assert len(lines) == 4
    assert lines[2].startswith("- mask_token_id: requested 248064, drafter 248070: ")


def test_drafter_config_option_and_target_num_layers(capsys):
    code, result = run_module(
        capsys,
        {
            "speculative_config": {"method": "eagle3", "model": "/not/used/for/reading"},
            "drafter_config": str(DRAFTERS / "eagle3-speculators" / "config.json"),
            "target_num_layers": 94,
        },
    )
    assert code == 0
    assert result["speculative_config"] == {
        "method": "eagle3",
        "model": "/not/used/for/reading",
        "num_speculative_tokens": 3,
    }


def test_warnings_reach_the_result(capsys):
    code, result = run_module(
        capsys,
        {"speculative_config": {"method": "eagle3", "model": str(DRAFTERS / "eagle"), "num_speculative_tokens": 3}},
    )
    assert code == 0
    # ansible-core 2.19+ wraps each warning in a WarningSummary object
    assert len(result["warnings"]) == 1 and "method: architecture carries no EAGLE-3 marker" in json.dumps(
        result["warnings"][0]
    )


def test_missing_drafter_fails_without_mismatches(capsys, tmp_path):
    code, result = run_module(capsys, {"speculative_config": {"method": "dflash", "model": str(tmp_path / "absent")}})
    assert code == 1 and result["mismatches"] == []
    assert "not found on this host" in result["msg"]


def test_ngram_with_allow_fields(capsys):
    code, result = run_module(
        capsys,
        {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4, "newer": 1}, "allow_fields": ["newer"]},
    )
    assert code == 0 and result["drafter_config"] is None
    assert json.loads(result["speculative_config_json"]) == {"method": "ngram", "num_speculative_tokens": 4, "newer": 1}


def test_server_arguments_and_environment_are_checked(capsys):
    code, result = run_module(
        capsys,
        {
            "speculative_config": {"method": "dflash", "model": DFLASH},
            "extra_args": ["--max-num-batched-tokens", "16", "--disable-log-stats"],
            "environment": {"VLLM_USE_V2_MODEL_RUNNER": "0"},
            "acceptance_gate": True,
            "vllm_version": "0.33.0",
        },
    )
    assert code == 1
    assert [(m["field"], m["source"]) for m in result["mismatches"]] == [
        ("VLLM_USE_V2_MODEL_RUNNER", "vllm"),
        ("num_speculative_tokens", "vllm"),
        ("extra_args", "vllm"),
    ]
    assert result["msg"].startswith("speculative_config is refused: vLLM 0.33.0 would fail or misbehave:")


def test_the_newest_release_applies_by_default_and_others_are_refused(capsys):
    """vLLM 0.34 (the default) has only the V2 model runner: nothing to pin for a mixed drafter, and a field 0.34
    removed is refused naming the release that still has it."""
    code, result = run_module(capsys, {"speculative_config": {"method": "dflash", "model": DFLASH}})
    assert code == 0 and result["vllm_version"] == "0.34.0" and result["environment"] == {}, result
    code, result = run_module(
        capsys, {"speculative_config": {"method": "dflash", "model": DFLASH, "disable_padded_drafter_batch": True}}
    )
    assert code == 1 and "a field of vLLM 0.32.0, 0.33.0, not of vLLM 0.34.0" in result["msg"], result
    code, result = run_module(capsys, {"speculative_config": {"method": "ngram"}, "vllm_version": "0.35.0"})
    assert code == 1 and "0.35.0" in result["msg"] and "0.34.0" in result["msg"], result
