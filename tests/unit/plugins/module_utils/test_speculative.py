# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pure tests of the speculative config checks, against drafter config.json fixtures."""
from __future__ import annotations

import json
import pathlib

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils._speculative import (
    SUPPORTED_METHODS,
    SpeculativeConfigError,
    validate_speculative_config,
)

DRAFTERS = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "drafters"
DFLASH = str(DRAFTERS / "dflash-qwen3")
TRAINED_IDS = [1, 16, 31, 46, 61]
GUESSED = {
    "method": "dflash", "model": DFLASH, "num_speculative_tokens": 15,
    "target_layer_ids": [1, 17, 33, 49, 63], "mask_token_id": 248064, "layer_types": "full_attention",
}


def drafter_variant(tmp_path, base, remove=(), **changes):
    """Copy of fixture drafter `base` with top-level keys changed or removed; returns the directory."""
    config = json.loads((DRAFTERS / base / "config.json").read_text())
    for key in remove:
        del config[key]
    config.update(changes)
    directory = tmp_path / ("%s-variant" % base)
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    return str(directory)


def fail(requested, **kwargs):
    with pytest.raises(SpeculativeConfigError) as caught:
        validate_speculative_config(requested, **kwargs)
    return caught.value


def by_field(checks):
    return {check["field"]: check for check in checks}


# DFlash: the reported case

def test_guessed_dflash_config_fails_with_three_field_explanations():
    error = fail(dict(GUESSED))
    fields = [mismatch["field"] for mismatch in error.mismatches]
    assert fields == ["target_layer_ids", "mask_token_id", "layer_types"]
    lines = str(error).splitlines()
    assert lines[0].startswith("speculative_config does not match the drafter")
    assert [line.split(":")[0] for line in lines[1:]] == ["- target_layer_ids", "- mask_token_id", "- layer_types"]
    layers, mask, layout = error.mismatches
    assert (layers["requested"], layers["drafter"]) == ([1, 17, 33, 49, 63], TRAINED_IDS)
    assert "[2, 18, 34, 50, 64] instead of the trained [2, 17, 32, 47, 62]" in layers["explanation"]
    assert "Layer(s) [63]: vLLM would tap layer(s) [64]" in layers["explanation"]
    assert (mask["requested"], mask["drafter"]) == (248064, 248070)
    assert layout["requested"] == ["full_attention"] * 5
    assert layout["drafter"] == ["sliding_attention"] * 4 + ["full_attention"]
    assert "requested 5 x full_attention, drafter 4 x sliding_attention + 1 x full_attention" in lines[3]
    assert "4 x causal + 1 x non-causal" in lines[3]
    for mismatch in error.mismatches:
        assert "acceptance collapses" in mismatch["explanation"]


def test_corrected_dflash_config_passes_and_needs_the_v2_model_runner():
    result = validate_speculative_config({
        "method": "dflash", "model": DFLASH, "num_speculative_tokens": 15, "target_layer_ids": TRAINED_IDS,
        "mask_token_id": 248070, "layer_types": ["sliding_attention"] * 4 + ["full_attention"], "sliding_window": 2048,
        "block_size": 16,
    })
    assert result["environment"] == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    # the drafter's own fields are checked, not passed to vLLM
    assert result["speculative_config"] == {"method": "dflash", "model": DFLASH, "num_speculative_tokens": 15}
    assert json.loads(result["speculative_config_json"]) == result["speculative_config"]
    assert " " not in result["speculative_config_json"].replace(DFLASH, "")
    assert result["filled"] == [] and result["warnings"] == []
    assert result["drafter_config"] == DFLASH + "/config.json"
    checks = by_field(result["checks"])
    checked = ("target_layer_ids", "mask_token_id", "layer_types", "sliding_window", "block_size", "num_speculative_tokens")
    assert {checks[name]["status"] for name in checked} == {"ok"}
    assert "[2, 17, 32, 47, 62]" in checks["target_layer_ids"]["detail"]


def test_omitted_fields_are_filled_from_the_drafter():
    result = validate_speculative_config({"method": "dflash", "model": DFLASH})
    assert result["speculative_config"] == {"method": "dflash", "model": DFLASH, "num_speculative_tokens": 15}
    assert result["filled"] == ["num_speculative_tokens"]
    checks = by_field(result["checks"])
    assert checks["num_speculative_tokens"]["status"] == "filled"
    for name, value in (("target_layer_ids", TRAINED_IDS), ("mask_token_id", 248070), ("sliding_window", 2048),
                        ("target_num_layers", 64), ("block_size", 16)):
        assert (checks[name]["status"], checks[name]["drafter"]) == ("from_drafter", value)


@pytest.mark.parametrize("tokens, ok", [(16, False), (15, True), (7, True)])
def test_num_speculative_tokens_is_at_most_block_size_minus_one(tokens, ok):
    requested = {"method": "dflash", "model": DFLASH, "num_speculative_tokens": tokens}
    if ok:
        assert validate_speculative_config(requested)["speculative_config"]["num_speculative_tokens"] == tokens
    else:
        error = fail(requested)
        assert [(m["field"], m["requested"], m["drafter"]) for m in error.mismatches] == [
            ("num_speculative_tokens", 16, "at most 15 (block_size 16)")]


def test_block_size_inside_dflash_config_is_used(tmp_path):
    model = drafter_variant(tmp_path, "dflash-qwen3", remove=["block_size"],
                            dflash_config={"mask_token_id": 248070, "target_layer_ids": TRAINED_IDS, "block_size": 8})
    result = validate_speculative_config({"method": "dflash", "model": model})
    assert result["speculative_config"]["num_speculative_tokens"] == 7


def test_ids_shifted_by_one_are_called_out():
    error = fail({"method": "dflash", "model": DFLASH, "target_layer_ids": [2, 17, 32, 47, 62]})
    assert [m["field"] for m in error.mismatches] == ["target_layer_ids"]
    assert "shifted by +1: vLLM tap ids and DFlash ids got mixed up" in error.mismatches[0]["explanation"]


def test_target_num_layers_must_agree_with_the_drafter():
    error = fail({"method": "dflash", "model": DFLASH}, target_num_layers=48)
    fields = [m["field"] for m in error.mismatches]
    assert fields[0] == "target_num_layers"
    assert (error.mismatches[0]["requested"], error.mismatches[0]["drafter"]) == (48, 64)
    # against 48 layers (0..47) the drafter's own id 61 cannot be tapped either; 46 can (tap 47)
    assert fields[1] == "target_layer_ids"
    assert "Layer(s) [61]: vLLM would tap layer(s) [62], but the target's layers are 0..47" in error.mismatches[1]["explanation"]


def test_target_num_layers_checks_drafters_without_num_target_layers(tmp_path):
    model = drafter_variant(tmp_path, "dflash-qwen3", remove=["num_target_layers"])
    assert validate_speculative_config({"method": "dflash", "model": model}, target_num_layers=64)
    error = fail({"method": "dflash", "model": model}, target_num_layers=62)
    assert "Layer(s) [61]: vLLM would tap layer(s) [62], but the target's layers are 0..61" in str(error)


# DFlash: a stale eagle_aux_hidden_state_layer_ids key

def test_stale_aux_ids_equal_to_the_vllm_taps_only_warn(tmp_path):
    model = drafter_variant(tmp_path, "dflash-qwen3", eagle_aux_hidden_state_layer_ids=[2, 17, 32, 47, 62])
    result = validate_speculative_config({"method": "dflash", "model": model})
    assert len(result["warnings"]) == 1
    assert result["warnings"][0].startswith("eagle_aux_hidden_state_layer_ids: config.json's")
    assert by_field(result["checks"])["eagle_aux_hidden_state_layer_ids"]["status"] == "warning"


def test_stale_aux_ids_without_the_shift_fail(tmp_path):
    model = drafter_variant(tmp_path, "dflash-qwen3", eagle_aux_hidden_state_layer_ids=TRAINED_IDS)
    error = fail({"method": "dflash", "model": model, "target_layer_ids": TRAINED_IDS})
    assert [m["field"] for m in error.mismatches] == ["eagle_aux_hidden_state_layer_ids"]
    mismatch = error.mismatches[0]
    assert (mismatch["requested"], mismatch["drafter"]) == (TRAINED_IDS, [2, 17, 32, 47, 62])
    assert "takes precedence over dflash_config.target_layer_ids" in mismatch["explanation"]
    assert "every tap is one layer early" in mismatch["explanation"]


def test_stale_aux_ids_inside_eagle_config_are_found(tmp_path):
    model = drafter_variant(tmp_path, "dflash-qwen3", eagle_config={"eagle_aux_hidden_state_layer_ids": [3, 20, 40]})
    error = fail({"method": "dflash", "model": model})
    assert [m["field"] for m in error.mismatches] == ["eagle_config.eagle_aux_hidden_state_layer_ids"]


# DFlash: attention layouts

def test_use_swa_makes_every_layer_sliding_without_the_v2_runner(tmp_path):
    model = drafter_variant(tmp_path, "dflash-qwen3", remove=["layer_types"], dflash_config={
        "mask_token_id": 248070, "target_layer_ids": TRAINED_IDS, "use_swa": True, "swa_window_size": 4096})
    result = validate_speculative_config({"method": "dflash", "model": model, "layer_types": "sliding_attention",
                                          "sliding_window": 4096})
    assert result["environment"] == {}
    checks = by_field(result["checks"])
    assert checks["layer_types"]["drafter"] == ["sliding_attention"] * 5
    assert "5 x non-causal" in checks["layer_types"]["detail"]


def test_all_full_drafter_rejects_a_requested_window(tmp_path):
    model = drafter_variant(tmp_path, "dflash-qwen3", layer_types=["full_attention"] * 5)
    result = validate_speculative_config({"method": "dflash", "model": model, "layer_types": "full_attention"})
    assert result["environment"] == {}
    error = fail({"method": "dflash", "model": model, "sliding_window": 2048})
    assert [m["field"] for m in error.mismatches] == ["sliding_window"]


def test_sliding_layers_without_a_window_fail(tmp_path):
    model = drafter_variant(tmp_path, "dflash-qwen3", remove=["sliding_window"])
    error = fail({"method": "dflash", "model": model})
    assert [m["field"] for m in error.mismatches] == ["layer_types"]
    assert "need a window" in error.mismatches[0]["explanation"]


def test_explicit_causal_overrides_the_per_layer_default(tmp_path):
    model = drafter_variant(tmp_path, "dflash-qwen3", dflash_config={
        "mask_token_id": 248070, "target_layer_ids": TRAINED_IDS, "causal": False})
    result = validate_speculative_config({"method": "dflash", "model": model})
    assert "5 x non-causal" in by_field(result["checks"])["layer_types"]["detail"]


def test_a_non_dflash_checkpoint_is_not_accepted_as_dflash():
    error = fail({"method": "dflash", "model": str(DRAFTERS / "eagle3")})
    assert [(m["field"], m["drafter"]) for m in error.mismatches] == [("method", "eagle3")]


# EAGLE, EAGLE-3, MTP, ngram

def test_eagle3_head_needs_num_speculative_tokens_when_it_declares_none():
    error = fail({"method": "eagle3", "model": str(DRAFTERS / "eagle3")})
    assert "num_speculative_tokens is not given" in str(error)
    result = validate_speculative_config({"method": "eagle3", "model": str(DRAFTERS / "eagle3"), "num_speculative_tokens": 3,
                                          "draft_tensor_parallel_size": 1})
    assert result["speculative_config_json"] == json.dumps(
        {"method": "eagle3", "model": str(DRAFTERS / "eagle3"), "num_speculative_tokens": 3, "draft_tensor_parallel_size": 1},
        separators=(",", ":"))
    assert result["environment"] == {} and result["warnings"] == []


def test_eagle3_speculators_checkpoint_fills_its_token_count_and_checks_aux_layers():
    model = str(DRAFTERS / "eagle3-speculators")
    result = validate_speculative_config({"method": "eagle3", "model": model}, target_num_layers=94)
    assert result["speculative_config"]["num_speculative_tokens"] == 3
    assert result["filled"] == ["num_speculative_tokens"]
    error = fail({"method": "eagle3", "model": model}, target_num_layers=64)
    assert [(m["field"], m["drafter"]) for m in error.mismatches] == [("eagle_aux_hidden_state_layer_ids", [1, 46, 90])]
    assert "[90] are never captured" in str(error)


def test_eagle_head_as_plain_causal_lm_is_accepted():
    result = validate_speculative_config({"method": "eagle", "model": str(DRAFTERS / "eagle"), "num_speculative_tokens": 5})
    assert by_field(result["checks"])["method"]["status"] == "ok"


def test_eagle3_on_a_plain_causal_lm_warns():
    result = validate_speculative_config({"method": "eagle3", "model": str(DRAFTERS / "eagle"), "num_speculative_tokens": 3})
    assert len(result["warnings"]) == 1 and "no EAGLE-3 marker" in result["warnings"][0]


@pytest.mark.parametrize("method, fixture, kind", [("eagle", "eagle3", "eagle3"), ("eagle", "mtp", "mtp"),
                                                   ("mtp", "eagle", "causal_lm"), ("eagle3", "dflash-qwen3", "dflash")])
def test_method_and_checkpoint_kind_must_agree(method, fixture, kind):
    error = fail({"method": method, "model": str(DRAFTERS / fixture), "num_speculative_tokens": 1})
    assert [(m["field"], m["requested"], m["drafter"]) for m in error.mismatches] == [("method", method, kind)]


def test_mtp_inside_the_target_checkpoint_fills_the_layer_count():
    result = validate_speculative_config({"method": "mtp"}, drafter_config=str(DRAFTERS / "mtp"))
    assert result["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 1}
    assert "num_nextn_predict_layers" in by_field(result["checks"])["num_speculative_tokens"]["detail"]
    assert "drafter_config=<target>/config.json" in str(fail({"method": "mtp", "num_speculative_tokens": 1}))


def test_mtp_token_count_must_be_a_multiple_of_the_mtp_layers(tmp_path):
    model = drafter_variant(tmp_path, "mtp", num_nextn_predict_layers=2)
    error = fail({"method": "mtp", "model": model, "num_speculative_tokens": 3})
    assert [(m["field"], m["requested"]) for m in error.mismatches] == [("num_speculative_tokens", 3)]
    result = validate_speculative_config({"method": "mtp", "model": model, "num_speculative_tokens": 4})
    assert "runs the same layers again" in result["warnings"][0]


def test_ngram_needs_no_drafter():
    result = validate_speculative_config({"method": "ngram", "num_speculative_tokens": "4", "prompt_lookup_max": 4,
                                          "prompt_lookup_min": 2})
    assert result["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
                                            "prompt_lookup_min": 2}
    assert result["drafter_config"] is None and result["environment"] == {}


@pytest.mark.parametrize("requested, message", [
    ({"method": "ngram", "prompt_lookup_max": 4}, "ngram needs num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 4},
     "prompt_lookup_min (5) must be <= prompt_lookup_max (4)"),
    ({"method": "ngram", "num_speculative_tokens": 4, "model": "/models/x"}, "ngram drafts from the prompt's own tokens"),
])
def test_ngram_errors(requested, message):
    assert message in str(fail(requested))


# Request errors

def test_missing_drafter_directory_is_a_clear_error(tmp_path):
    missing = str(tmp_path / "no-such-drafter")
    error = fail({"method": "dflash", "model": missing})
    assert str(error).startswith("drafter config %s/config.json not found on this host" % missing)
    assert "drafter_config" in str(error) and error.mismatches == []


def test_hugging_face_id_is_not_downloaded():
    assert "not found on this host" in str(fail({"method": "dflash", "model": "z-lab/Qwen3.5-27B-DFlash-not-local"}))


def test_invalid_json_drafter_config(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    assert "is not valid JSON" in str(fail({"method": "eagle", "model": str(tmp_path), "num_speculative_tokens": 1}))


@pytest.mark.parametrize("method, hint", [("medusa", ""), ("deepseek_mtp", "replaced the per-model MTP method names"), (None, "")])
def test_invalid_method_is_a_clear_error(method, hint):
    requested = {"model": DFLASH} if method is None else {"method": method, "model": DFLASH}
    message = str(fail(requested))
    assert "supported methods: %s" % ", ".join(SUPPORTED_METHODS) in message
    assert hint in message


def test_unknown_fields_are_rejected_with_the_accepted_list():
    error = fail({"method": "eagle3", "model": DFLASH, "tensor_parallel_size": 2, "target_layer_ids": [1]})
    message = str(error)
    assert "not accepted for method eagle3: tensor_parallel_size, target_layer_ids" in message
    assert "draft_tensor_parallel_size" in message
    assert "Accepted fields: method, num_speculative_tokens, enforce_eager, model, draft_tensor_parallel_size" in message


def test_allow_fields_pass_newer_vllm_fields_through():
    result = validate_speculative_config({"method": "ngram", "num_speculative_tokens": 3, "future_knob": {"a": 1}},
                                         allow_fields=["future_knob"])
    assert result["speculative_config"]["future_knob"] == {"a": 1}


def test_invalid_values_are_listed_together():
    message = str(fail({"method": "dflash", "model": DFLASH, "num_speculative_tokens": True, "target_layer_ids": "1,16",
                        "layer_types": ["sliding"]}))
    assert "num_speculative_tokens: expected an integer" in message
    assert "target_layer_ids: expected a non-empty list" in message
    assert "layer_types: expected sliding_attention or full_attention" in message
