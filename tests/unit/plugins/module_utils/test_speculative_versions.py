# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The speculative-config checks per vLLM release: what 0.32.0 and 0.34.0 change in 0.33.0's tables, read from
their wheels (test_speculative.py describes 0.33.0)."""

from __future__ import annotations

import pathlib

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _speculative_vllm
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative import (
    SpeculativeConfigError,
    validate_speculative_config,
)

DRAFTERS = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "drafters"
DFLASH = str(DRAFTERS / "dflash-qwen3")  # 4 sliding + 1 full attention layers, block size 16
EAGLE3 = str(DRAFTERS / "eagle3")


def refused(requested, version, **kwargs):
    with pytest.raises(SpeculativeConfigError) as caught:
        validate_speculative_config(requested, vllm_version=version, **kwargs)
    return str(caught.value)


# The tables: one base and each release's differences


def test_each_release_has_its_fields_and_methods():
    old, base, new = (_speculative_vllm.facts(v) for v in ("0.32.0", "0.33.0", "0.34.0"))
    assert set(base.fields) - set(old.fields) == {
        "disable_lookahead_block_hashes",
        "draft_lm_head_quantization",
        "xpress_topc",
        "fly_window_size",
        "fly_entropy_threshold",
        "fly_entropy_top_k",
    }
    assert set(new.fields) ^ set(base.fields) == {
        "disable_padded_drafter_batch",
        "use_heterogeneous_vocab",
        "draft_decode_context_parallel_size",
        "suffix_decoding_corpus_tokens",
        "speculator_options",
    }
    assert "custom_method" not in new.fields and "custom_method" in new.refused_fields
    assert {"medusa", "mlp_speculator"} <= set(old.methods) and not old.removed_methods
    assert (
        "custom_class" in base.methods and "custom_class" not in new.methods and "custom_class" in new.removed_methods
    )
    assert "nemotron3_5_transcribe_mtp" in new.mtp_methods and "step5_mtp" not in old.mtp_methods
    assert (old.v1_runner, base.v1_runner, new.v1_runner) == (True, True, False)
    assert (old.custom_methods, base.custom_methods, new.custom_methods) == (False, False, True)
    assert new.inferred_by_name == base.inferred_by_name and "speculator_config.py" in new.inferred_at
    assert _speculative_vllm.facts() is new
    with pytest.raises(KeyError):
        _speculative_vllm.facts("0.31.0")


# Fields


def test_disable_padded_drafter_batch_is_refused_on_0_34_only():
    spec = {"method": "ngram", "num_speculative_tokens": 4, "disable_padded_drafter_batch": True}
    for version in ("0.32.0", "0.33.0"):
        assert validate_speculative_config(dict(spec), vllm_version=version)["speculative_config"] == spec
    message = refused(dict(spec), "0.34.0")
    assert "disable_padded_drafter_batch=true: a field of vLLM 0.32.0, 0.33.0, not of vLLM 0.34.0's" in message
    assert "the server fails at start" in message


def test_fields_0_34_added_are_refused_before_it():
    spec = {"method": "suffix", "num_speculative_tokens": 8, "suffix_decoding_corpus_tokens": 0}
    assert validate_speculative_config(dict(spec), vllm_version="0.34.0")["speculative_config"] == spec
    message = refused(dict(spec), "0.33.0")
    assert "suffix_decoding_corpus_tokens=0: a field of vLLM 0.34.0, not of vLLM 0.33.0's SpeculativeConfig" in message
    message = refused({"method": "ngram", "num_speculative_tokens": 4, "xpress_topc": 2}, "0.32.0")
    assert "a field of vLLM 0.33.0, 0.34.0, not of vLLM 0.32.0's" in message


def test_custom_method_is_what_vllm_0_34_fills_itself():
    message = refused({"method": "ngram", "num_speculative_tokens": 4, "custom_method": "my_drafter"}, "0.34.0")
    assert "custom_method=my_drafter: vLLM 0.34 sets custom_method itself" in message
    assert "name the method a plugin registered in method" in message
    assert "not a field of vLLM 0.33.0's" in refused({"method": "ngram", "custom_method": "x"}, "0.33.0")


def test_fields_without_effect_in_0_34_are_warned_about():
    spec = {"method": "ngram", "num_speculative_tokens": 4, "parallel_drafting": True}
    assert validate_speculative_config(dict(spec), vllm_version="0.33.0")["warnings"] == []
    warnings = validate_speculative_config(dict(spec), vllm_version="0.34.0")["warnings"]
    assert warnings == [
        "parallel_drafting: deprecated in vLLM 0.34 and has no effect: DFlash and DSpark always draft in parallel, "
        "and no other method supports it"
    ]


# Methods


def test_a_plugin_method_is_accepted_on_0_34_and_refused_on_0_33():
    spec = {"method": "my_plugin_drafter", "num_speculative_tokens": 4}
    result = validate_speculative_config(dict(spec), vllm_version="0.34.0")
    assert result["speculative_config"] == spec and result["vllm_version"] == "0.34.0"
    assert (
        len(result["warnings"]) == 1
        and "'my_plugin_drafter' is no built-in method of vLLM 0.34.0" in (result["warnings"][0])
    )
    assert "a vLLM plugin on the host registers it" in result["warnings"][0]
    message = refused(dict(spec), "0.33.0")
    assert message.startswith("speculative_config.method 'my_plugin_drafter' is not a method of vLLM 0.33.0")
    assert "vLLM 0.34.0 runs a method a vLLM plugin registers; vLLM 0.33.0 runs only its built-in ones" in message


def test_a_misspelt_method_is_refused_even_where_plugins_may_add_methods():
    message = refused({"method": "dflsh", "model": DFLASH}, "0.34.0")
    assert "is not a method of vLLM 0.34.0 (did you mean dflash?)" in message


def test_methods_removed_or_added_name_their_releases():
    spec = {"method": "medusa", "model": "/models/medusa-heads", "num_speculative_tokens": 4}
    result = validate_speculative_config(dict(spec), vllm_version="0.32.0")
    assert result["warnings"] == [
        "method: vLLM 0.32.0 accepts method medusa; this module checks no drafter for it (only dflash, eagle, "
        "eagle3, mtp, ngram)"
    ]
    assert "(Medusa heads are no longer a speculative method (removed in vLLM 0.33))" in refused(dict(spec), "0.33.0")
    message = refused({"method": "custom_class", "model": "pkg.Drafter"}, "0.34.0")
    assert "custom_class was removed in vLLM 0.34" in message
    assert "(a method of vLLM 0.34.0 only)" in refused({"method": "nemotron3_5_transcribe_mtp"}, "0.33.0")


def test_the_method_inferred_from_the_drafter_name_says_where_each_release_reads_it():
    for version, where in (
        ("0.33.0", "vllm/config/speculative.py SpeculativeConfig.__post_init__"),
        ("0.34.0", "vllm/v1/worker/gpu/spec_decode/speculator_config.py _CHECKPOINT_DETECTION_ORDER"),
    ):
        result = validate_speculative_config({"model": EAGLE3, "num_speculative_tokens": 3}, vllm_version=version)
        filled = [check for check in result["checks"] if check["field"] == "method"][0]
        assert result["speculative_config"]["method"] == "eagle3" and where in filled["detail"], filled


# The V1 model runner, which 0.34 no longer has


def test_a_mixed_dflash_drafter_needs_no_runner_pin_on_0_34():
    spec = {"method": "dflash", "model": DFLASH}
    assert validate_speculative_config(dict(spec), vllm_version="0.33.0")["environment"] == {
        "VLLM_USE_V2_MODEL_RUNNER": "1"
    }
    assert validate_speculative_config(dict(spec), vllm_version="0.34.0")["environment"] == {}
    assert "Model Runner V1 does not support" in refused(
        dict(spec), "0.33.0", environment={"VLLM_USE_V2_MODEL_RUNNER": "0"}
    )
    result = validate_speculative_config(
        dict(spec), vllm_version="0.34.0", environment={"VLLM_USE_V2_MODEL_RUNNER": "0"}
    )
    assert result["warnings"] == [
        "VLLM_USE_V2_MODEL_RUNNER: vLLM 0.34.0 has no V1 model runner and does not read VLLM_USE_V2_MODEL_RUNNER: "
        "remove it"
    ]


# The token budget: 0.32 counted new slots, 0.33 and 0.34 count lookahead tokens


@pytest.mark.parametrize(
    "version, method, tokens, budget, refusal",
    [
        ("0.33.0", "dflash", 15, 16, "dflash takes K + 1 = 16 query tokens per request"),
        ("0.32.0", "dflash", 15, 16, None),
        ("0.32.0", "dflash", 16, 16, "dflash takes K = 16 new slots per request and vLLM 0.32.0 refuses"),
        ("0.33.0", "eagle3", 3, 3, "eagle3 takes K = 3 query tokens per request"),
        ("0.32.0", "eagle3", 3, 3, None),
    ],
)
def test_the_token_budget_as_each_release_checks_it(version, method, tokens, budget, refusal):
    spec = {"method": method, "model": DFLASH if method == "dflash" else EAGLE3, "num_speculative_tokens": tokens}
    args = ["--max-num-batched-tokens", str(budget), "--max-num-seqs", "1"]
    if refusal is None:
        validate_speculative_config(spec, vllm_version=version, extra_args=args)
    else:
        assert refusal in refused(spec, version, extra_args=args)
