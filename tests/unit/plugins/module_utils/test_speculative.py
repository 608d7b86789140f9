# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pure tests of the speculative config checks, against drafter config.json fixtures."""

from __future__ import annotations

import json
import pathlib

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative import (
    SpeculativeConfigError,
    validate_speculative_config as validate_for_version,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_vllm import batch_class

DRAFTERS = pathlib.Path(__file__).resolve().parents[3] / "fixtures" / "drafters"
DFLASH = str(DRAFTERS / "dflash-qwen3")
TRAINED_IDS = [1, 16, 31, 46, 61]
GUESSED = {
    "method": "dflash",
    "model": DFLASH,
    "num_speculative_tokens": 15,
    "target_layer_ids": [1, 17, 33, 49, 63],
    "mask_token_id": 248064,
    "layer_types": "full_attention",
}


def validate_speculative_config(requested, **kwargs):
    """The checks as vLLM 0.33.0 reads a config, which these tests describe (test_speculative_versions.py: the
    differences of 0.32 and 0.34)."""
    kwargs.setdefault("vllm_version", "0.33.0")
    return validate_for_version(requested, **kwargs)


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
    # id 63 on the 64-layer target is tappable (hidden state 64: the last layer's output, before the final norm)
    assert "Layer(s)" not in layers["explanation"]
    assert (mask["requested"], mask["drafter"]) == (248064, 248070)
    assert layout["requested"] == ["full_attention"] * 5
    assert layout["drafter"] == ["sliding_attention"] * 4 + ["full_attention"]
    assert "requested 5 x full_attention, drafter 4 x sliding_attention + 1 x full_attention" in lines[3]
    assert "4 x causal + 1 x non-causal" in lines[3]
    for mismatch in error.mismatches:
        assert "acceptance collapses" in mismatch["explanation"]


def test_corrected_dflash_config_passes_and_needs_the_v2_model_runner():
    result = validate_speculative_config(
        {
            "method": "dflash",
            "model": DFLASH,
            "num_speculative_tokens": 15,
            "target_layer_ids": TRAINED_IDS,
            "mask_token_id": 248070,
            "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
            "sliding_window": 2048,
            "block_size": 16,
        }
    )
    assert result["environment"] == {"VLLM_USE_V2_MODEL_RUNNER": "1"}
    # the drafter's own fields are checked, not passed to vLLM
    assert result["speculative_config"] == {"method": "dflash", "model": DFLASH, "num_speculative_tokens": 15}
    assert json.loads(result["speculative_config_json"]) == result["speculative_config"]
    assert " " not in result["speculative_config_json"].replace(DFLASH, "")
    assert result["filled"] == [] and result["warnings"] == []
    assert result["drafter_config"] == DFLASH + "/config.json"
    checks = by_field(result["checks"])
    checked = (
        "target_layer_ids",
        "mask_token_id",
        "layer_types",
        "sliding_window",
        "block_size",
        "num_speculative_tokens",
    )
    assert {checks[name]["status"] for name in checked} == {"ok"}
    assert "[2, 17, 32, 47, 62]" in checks["target_layer_ids"]["detail"]


def test_omitted_fields_are_filled_from_the_drafter():
    result = validate_speculative_config({"method": "dflash", "model": DFLASH})
    assert result["speculative_config"] == {"method": "dflash", "model": DFLASH, "num_speculative_tokens": 15}
    assert result["filled"] == ["num_speculative_tokens"]
    checks = by_field(result["checks"])
    assert checks["num_speculative_tokens"]["status"] == "filled"
    for name, value in (
        ("target_layer_ids", TRAINED_IDS),
        ("mask_token_id", 248070),
        ("sliding_window", 2048),
        ("target_num_layers", 64),
        ("block_size", 16),
    ):
        assert (checks[name]["status"], checks[name]["drafter"]) == ("from_drafter", value)


@pytest.mark.parametrize("tokens, warned", [(16, True), (15, False), (7, False)])
def test_num_speculative_tokens_past_block_size_minus_one_only_warns(tokens, warned):
    # vLLM 0.33 does not compare num_speculative_tokens with the DFlash block_size: it serves 16 with block 16
    result = validate_speculative_config({"method": "dflash", "model": DFLASH, "num_speculative_tokens": tokens})
    assert result["speculative_config"]["num_speculative_tokens"] == tokens
    check = by_field(result["checks"])["num_speculative_tokens"]
    assert check["status"] == ("warning" if warned else "ok")
    if warned:
        assert "more than block_size - 1 = 15: vLLM 0.33.0 serves it" in result["warnings"][0]


def test_block_size_inside_dflash_config_is_used(tmp_path):
    model = drafter_variant(
        tmp_path,
        "dflash-qwen3",
        remove=["block_size"],
        dflash_config={"mask_token_id": 248070, "target_layer_ids": TRAINED_IDS, "block_size": 8},
    )
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
    # against 48 layers the drafter's own id 61 cannot be tapped (hidden states 0..48 exist); 46 can (state 47)
    assert fields[1] == "target_layer_ids"
    assert (
        "Layer(s) [61]: vLLM would tap hidden state(s) [62], but on a 48-layer target vLLM captures only hidden "
        "states 0..48" in error.mismatches[1]["explanation"]
    )


def test_target_num_layers_checks_drafters_without_num_target_layers(tmp_path):
    model = drafter_variant(tmp_path, "dflash-qwen3", remove=["num_target_layers"])
    assert validate_speculative_config({"method": "dflash", "model": model}, target_num_layers=64)
    # id 61 -> hidden state 62 = the output of the last layer of a 62-layer target: valid
    assert validate_speculative_config({"method": "dflash", "model": model}, target_num_layers=62)
    error = fail({"method": "dflash", "model": model}, target_num_layers=61)
    assert "Layer(s) [61]: vLLM would tap hidden state(s) [62], but on a 61-layer target" in str(error)


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
    assert "takes precedence over dflash_config.target_layer_ids in the V2 model runner" in mismatch["explanation"]
    assert "every tap is one layer early" in mismatch["explanation"]


def test_aux_ids_inside_eagle_config_matter_only_to_the_v1_runner(tmp_path):
    model = drafter_variant(tmp_path, "dflash-qwen3", eagle_config={"eagle_aux_hidden_state_layer_ids": [3, 20, 40]})
    # V2 (the default): vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py never reads it
    result = validate_speculative_config({"method": "dflash", "model": model})
    assert by_field(result["checks"])["eagle_config.eagle_aux_hidden_state_layer_ids"]["status"] == "warning"
    # V1 (gpu_model_runner.py): it replaces dflash_config.target_layer_ids + 1
    (tmp_path / "v1").mkdir()
    model = drafter_variant(
        tmp_path / "v1",
        "dflash-qwen3",
        layer_types=["full_attention"] * 5,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [3, 20, 40]},
    )
    error = fail({"method": "dflash", "model": model}, environment={"VLLM_USE_V2_MODEL_RUNNER": "0"})
    assert [(m["field"], m["requested"]) for m in error.mismatches] == [
        ("eagle_config.eagle_aux_hidden_state_layer_ids", [3, 20, 40])
    ]
    assert "V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0)" in error.mismatches[0]["explanation"]


def test_top_level_target_layer_ids_are_read_when_dflash_config_has_none(tmp_path):
    # eagle3_utils.py: dflash_config.target_layer_ids + 1, then dspark_target_layer_ids + 1, then target_layer_ids + 1
    model = drafter_variant(
        tmp_path, "dflash-qwen3", target_layer_ids=TRAINED_IDS, dflash_config={"mask_token_id": 248070}
    )
    result = validate_speculative_config({"method": "dflash", "model": model, "target_layer_ids": TRAINED_IDS})
    check = by_field(result["checks"])["target_layer_ids"]
    assert check["status"] == "ok" and check["detail"].startswith("target_layer_ids; vLLM taps hidden states [2, 17")
    assert "guessed" not in str(result["warnings"])


def test_dspark_ids_come_before_top_level_target_layer_ids(tmp_path):
    model = drafter_variant(
        tmp_path,
        "dflash-qwen3",
        target_layer_ids=TRAINED_IDS,
        dspark_target_layer_ids=[0, 1, 2, 3, 4],
        dflash_config={"mask_token_id": 248070},
    )
    error = fail({"method": "dflash", "model": model})
    assert [(m["field"], m["requested"], m["drafter"]) for m in error.mismatches] == [
        ("dspark_target_layer_ids", [1, 2, 3, 4, 5], [2, 17, 32, 47, 62])
    ]


def speculators_dflash(tmp_path, **changes):
    """A speculators-format DFlash drafter (vllm/transformers_utils/configs/speculators/algos.py update_dflash)."""
    config = {
        "architectures": ["DFlashSpeculator"],
        "speculators_model_type": "dflash",
        "speculators_config": {
            "algorithm": "dflash",
            "proposal_methods": [{"speculative_tokens": 7}],
            "verifier": {"name_or_path": "Qwen/Qwen3-8B"},
        },
        "transformer_layer_config": {"model_type": "qwen3", "num_hidden_layers": 1, "hidden_size": 4096},
        "aux_hidden_state_layer_ids": [2, 17, 32, 47, 62],
        "mask_token_id": 151669,
        "num_target_layers": 64,
    }
    config.update(changes)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return str(tmp_path)


def test_speculators_format_dflash_taps_its_aux_ids(tmp_path):
    model = speculators_dflash(tmp_path)
    result = validate_speculative_config(
        {"method": "dflash", "model": model, "target_layer_ids": TRAINED_IDS, "mask_token_id": 151669}
    )
    checks = by_field(result["checks"])
    assert checks["target_layer_ids"]["status"] == "ok" and checks["mask_token_id"]["status"] == "ok"
    # no block_size: num_speculative_tokens from speculators_config; sliding_window_non_causal default -> non-causal
    assert result["speculative_config"]["num_speculative_tokens"] == 7
    assert "1 x non-causal" in checks["layer_types"]["detail"] and result["warnings"] == []
    error = fail({"method": "dflash", "model": model, "target_layer_ids": [2, 17, 32, 47, 62]})
    assert "shifted by +1" in error.mismatches[0]["explanation"]


def test_mask_token_id_falls_back_to_the_top_level_key(tmp_path):
    model = drafter_variant(
        tmp_path, "dflash-qwen3", mask_token_id=151669, dflash_config={"target_layer_ids": TRAINED_IDS}
    )
    assert (
        by_field(validate_speculative_config({"method": "dflash", "model": model, "mask_token_id": 151669})["checks"])[
            "mask_token_id"
        ]["status"]
        == "ok"
    )
    error = fail({"method": "dflash", "model": model, "mask_token_id": 248070})
    assert [(m["field"], m["requested"], m["drafter"]) for m in error.mismatches] == [("mask_token_id", 248070, 151669)]


# DFlash: attention layouts


def test_use_swa_makes_every_layer_sliding_and_needs_no_runner(tmp_path):
    model = drafter_variant(
        tmp_path,
        "dflash-qwen3",
        remove=["layer_types"],
        dflash_config={
            "mask_token_id": 248070,
            "target_layer_ids": TRAINED_IDS,
            "use_swa": True,
            "swa_window_size": 4096,
        },
    )
    result = validate_speculative_config(
        {"method": "dflash", "model": model, "layer_types": "sliding_attention", "sliding_window": 4096}
    )
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
    model = drafter_variant(
        tmp_path,
        "dflash-qwen3",
        dflash_config={"mask_token_id": 248070, "target_layer_ids": TRAINED_IDS, "causal": False},
    )
    result = validate_speculative_config({"method": "dflash", "model": model})
    assert "5 x non-causal" in by_field(result["checks"])["layer_types"]["detail"]


def test_swa_window_size_wins_over_sliding_window(tmp_path):
    model = drafter_variant(
        tmp_path,
        "dflash-qwen3",
        dflash_config={"mask_token_id": 248070, "target_layer_ids": TRAINED_IDS, "swa_window_size": 1024},
    )
    assert validate_speculative_config({"method": "dflash", "model": model, "sliding_window": 1024})
    error = fail({"method": "dflash", "model": model, "sliding_window": 2048})
    assert [(m["field"], m["requested"], m["drafter"]) for m in error.mismatches] == [("sliding_window", 2048, 1024)]


def test_dflash_config_is_causal_is_not_read_by_vllm(tmp_path):
    # qwen3_dflash.py _dflash_layer_causal: top-level is_causal, then dflash_config.causal; is_causal inside is ignored
    model = drafter_variant(
        tmp_path,
        "dflash-qwen3",
        dflash_config={"mask_token_id": 248070, "target_layer_ids": TRAINED_IDS, "is_causal": False},
    )
    error = fail({"method": "dflash", "model": model})
    assert [(m["field"], m["requested"]) for m in error.mismatches] == [("dflash_config.is_causal", False)]
    assert "rename it to dflash_config.causal" in error.mismatches[0]["explanation"]
    assert "4 x causal + 1 x non-causal" in error.mismatches[0]["explanation"]


def test_top_level_is_causal_wins_over_dflash_config_causal(tmp_path):
    model = drafter_variant(
        tmp_path,
        "dflash-qwen3",
        is_causal=True,
        dflash_config={"mask_token_id": 248070, "target_layer_ids": TRAINED_IDS, "causal": False},
    )
    assert (
        "5 x causal"
        in by_field(validate_speculative_config({"method": "dflash", "model": model})["checks"])["layer_types"][
            "detail"
        ]
    )


@pytest.mark.parametrize("value", ["0", 0])
def test_v1_runner_forced_with_a_mixed_drafter_is_refused(value):
    error = fail({"method": "dflash", "model": DFLASH}, environment={"VLLM_USE_V2_MODEL_RUNNER": value})
    assert [(m["field"], m["requested"], m["drafter"]) for m in error.mismatches] == [
        ("VLLM_USE_V2_MODEL_RUNNER", "0", "unset or 1")
    ]
    assert "'Model Runner V1 does not support: mixed sliding/full dflash drafts'" in str(error)
    assert "Remove the variable (V2 is the default)" in str(error)


def test_v2_runner_is_the_default_for_a_mixed_drafter():
    for environment in (None, {}, {"VLLM_USE_V2_MODEL_RUNNER": "1"}):
        result = validate_speculative_config({"method": "dflash", "model": DFLASH}, environment=environment)
        assert "V2 is vLLM 0.33.0's default" in by_field(result["checks"])["VLLM_USE_V2_MODEL_RUNNER"]["detail"]
    error = fail({"method": "dflash", "model": DFLASH}, environment={"VLLM_USE_V2_MODEL_RUNNER": "true"})
    assert "vLLM reads it with int()" in str(error)


def test_a_non_dflash_checkpoint_is_not_accepted_as_dflash():
    error = fail({"method": "dflash", "model": str(DRAFTERS / "eagle3")})
    assert [(m["field"], m["drafter"]) for m in error.mismatches] == [("method", "eagle3")]


# EAGLE, EAGLE-3, MTP, ngram


def test_eagle3_head_needs_num_speculative_tokens_when_it_declares_none():
    error = fail({"method": "eagle3", "model": str(DRAFTERS / "eagle3")})
    assert "num_speculative_tokens is not given" in str(error)
    result = validate_speculative_config(
        {
            "method": "eagle3",
            "model": str(DRAFTERS / "eagle3"),
            "num_speculative_tokens": 3,
            "draft_tensor_parallel_size": 1,
        }
    )
    assert result["speculative_config_json"] == json.dumps(
        {
            "method": "eagle3",
            "model": str(DRAFTERS / "eagle3"),
            "num_speculative_tokens": 3,
            "draft_tensor_parallel_size": 1,
        },
        separators=(",", ":"),
    )
    assert result["environment"] == {} and result["warnings"] == []


def test_eagle3_speculators_checkpoint_fills_its_token_count_and_checks_aux_layers():
    model = str(DRAFTERS / "eagle3-speculators")
    result = validate_speculative_config({"method": "eagle3", "model": model}, target_num_layers=94)
    assert result["speculative_config"]["num_speculative_tokens"] == 3
    assert result["filled"] == ["num_speculative_tokens"]
    error = fail({"method": "eagle3", "model": model}, target_num_layers=64)
    assert [(m["field"], m["drafter"]) for m in error.mismatches] == [("eagle_aux_hidden_state_layer_ids", [1, 46, 90])]
    assert "[90] are never captured" in str(error)
    # aux id 90 == the layer count: the last layer's output before the final norm, captured by vLLM
    assert validate_speculative_config({"method": "eagle3", "model": model}, target_num_layers=90)
    assert "[90] are never captured" in str(fail({"method": "eagle3", "model": model}, target_num_layers=89))


def test_eagle_head_as_plain_causal_lm_is_accepted():
    result = validate_speculative_config(
        {"method": "eagle", "model": str(DRAFTERS / "eagle"), "num_speculative_tokens": 5}
    )
    assert by_field(result["checks"])["method"]["status"] == "ok"


def test_eagle3_on_a_plain_causal_lm_warns():
    result = validate_speculative_config(
        {"method": "eagle3", "model": str(DRAFTERS / "eagle"), "num_speculative_tokens": 3}
    )
    assert len(result["warnings"]) == 1 and "no EAGLE-3 marker" in result["warnings"][0]


@pytest.mark.parametrize(
    "method, fixture, kind",
    [
        ("eagle", "eagle3", "eagle3"),
        ("eagle", "mtp", "mtp"),
        ("mtp", "eagle", "causal_lm"),
        ("eagle3", "dflash-qwen3", "dflash"),
    ],
)
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
    result = validate_speculative_config(
        {"method": "ngram", "num_speculative_tokens": "4", "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    )
    assert result["speculative_config"] == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    assert result["drafter_config"] is None and result["environment"] == {}


@pytest.mark.parametrize(
    "requested, message",
    [
        ({"method": "ngram", "prompt_lookup_max": 4}, "ngram needs num_speculative_tokens"),
        (
            {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 5, "prompt_lookup_max": 4},
            "prompt_lookup_min (5) must be <= prompt_lookup_max (4)",
        ),
    ],
)
def test_ngram_errors(requested, message):
    assert message in str(fail(requested))


def test_ngram_with_a_model_is_served_by_vllm_and_only_warns():
    result = validate_speculative_config({"method": "ngram", "num_speculative_tokens": 4, "model": "/models/x"})
    assert "ngram drafts from the prompt's own tokens; vLLM 0.33.0 ignores model=/models/x" in result["warnings"][0]


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


@pytest.mark.parametrize(
    "method, hint",
    [
        ("medusa", "Medusa heads are no longer a speculative method"),
        ("mlp_speculator", "MLP speculators are no longer a speculative method"),
        ("foo_mtp", "knows only its own list of per-model MTP names"),
        ("eagle4", ""),
    ],
)
def test_methods_vllm_refuses_are_refused(method, hint):
    message = str(fail({"method": method, "model": DFLASH}))
    assert message.startswith("speculative_config.method %r is not a method of vLLM 0.33.0" % method)
    assert "accepts only ngram, draft_model, suffix, custom_class, eagle, eagle3" in message
    assert "fails validation when the server starts" in message and hint in message


def test_per_model_mtp_method_is_accepted_and_rewritten_to_mtp():
    result = validate_speculative_config({"method": "deepseek_mtp"}, drafter_config=str(DRAFTERS / "mtp"))
    assert result["speculative_config"]["method"] == "mtp"
    assert "logs 'method `deepseek_mtp` is deprecated and replaced with mtp'" in result["warnings"][0]


@pytest.mark.parametrize("method", ["suffix", "draft_model", "ngram_gpu", "dspark"])
def test_other_vllm_methods_are_accepted_unchecked(method):
    result = validate_speculative_config({"method": method, "model": "/models/drafter", "num_speculative_tokens": 3})
    assert result["speculative_config"]["method"] == method
    assert (
        any("this module checks no drafter for it" in warning for warning in result["warnings"])
        or method == "ngram_gpu"
    )


def test_method_is_inferred_from_the_model_path_like_vllm():
    result = validate_speculative_config({"model": DFLASH})
    assert result["speculative_config"]["method"] == "dflash" and "method" in result["filled"]
    assert "neither method nor model" in str(fail({"num_speculative_tokens": 3}))


@pytest.mark.parametrize(
    "field, value, reason",
    [
        ("tensor_parallel_size", 2, "the drafter's tensor parallel size is draft_tensor_parallel_size"),
        ("speculative_token_tree", "[(0,)]", "no speculative_token_tree field any more"),
        ("future_knob", 1, "config classes forbid unknown fields: the server fails at start"),
        ("target_layer_ids", [1], "only with method dflash"),
    ],
)
def test_fields_vllm_refuses_are_refused_with_name_value_and_reason(field, value, reason):
    message = str(fail({"method": "eagle3", "model": DFLASH, field: value}))
    assert message.startswith("speculative_config field(s) refused: %s=" % field)
    assert reason in message
    assert "Fields vLLM 0.33.0 accepts: method, model, num_speculative_tokens" in message


def test_every_vllm_033_field_is_accepted_and_dashes_are_underscores():
    result = validate_speculative_config(
        {
            "method": "eagle3",
            "model": str(DRAFTERS / "eagle3"),
            "num-speculative-tokens": 3,
            "rejection_sample_method": "block",
            "disable_eagle_block_drop": True,
            "kv_cache_dtype": "fp8",
            "draft_sample_method": "probabilistic",
        }
    )
    assert result["speculative_config"]["num_speculative_tokens"] == 3
    assert result["speculative_config"]["rejection_sample_method"] == "block"
    assert "draft_sample_method: vLLM accepts greedy or probabilistic" in str(
        fail(
            {
                "method": "eagle3",
                "model": str(DRAFTERS / "eagle3"),
                "num_speculative_tokens": 3,
                "draft_sample_method": "topk",
            }
        )
    )


def test_allow_fields_pass_newer_vllm_fields_through():
    result = validate_speculative_config(
        {"method": "ngram", "num_speculative_tokens": 3, "future_knob": {"a": 1}}, allow_fields=["future_knob"]
    )
    assert result["speculative_config"]["future_knob"] == {"a": 1}


def test_invalid_values_are_listed_together():
    message = str(
        fail(
            {
                "method": "dflash",
                "model": DFLASH,
                "num_speculative_tokens": True,
                "target_layer_ids": "1,16",
                "layer_types": ["sliding"],
            }
        )
    )
    assert "num_speculative_tokens: expected an integer" in message
    assert "target_layer_ids: expected a non-empty list" in message
    assert "layer_types: expected sliding_attention or full_attention" in message


# Token budget (vllm-project/vllm#50708) and metrics


def test_dflash_budget_vllm_refuses_is_caught_with_the_arithmetic():
    requested = {"method": "dflash", "model": DFLASH, "num_speculative_tokens": 15}
    error = fail(requested, extra_args=["--max-num-batched-tokens", "16", "--max-num-seqs=4"])
    assert [(m["field"], m["requested"]) for m in error.mismatches] == [("num_speculative_tokens", 15)]
    message = str(error)
    assert message.startswith("speculative_config is refused: vLLM 0.33.0 would fail or misbehave")
    assert "at most 14 with max_num_batched_tokens 16" in message
    assert "K + 1 = 16 query tokens per request" in message and "max_num_batched_tokens <= 16" in message
    result = validate_speculative_config(requested, extra_args=["--max-num-batched-tokens=17", "--max-num-seqs", "1"])
    assert result["warnings"] == []


def test_a_budget_the_server_gives_is_not_called_vllms_default():
    # --max-num-batched-tokens given, --max-num-seqs not: the slot check reads only the given value
    requested = {"method": "dflash", "model": DFLASH, "num_speculative_tokens": 15}
    for gpu_class in (None, "H100/H200 class (70-160 GiB)"):
        error = fail(requested, extra_args=["--max-num-batched-tokens", "16"], gpu_class=gpu_class)
        message = str(error)
        assert "num_speculative_tokens: 15; vLLM 0.33.0 expects at most 14 with max_num_batched_tokens 16: " in message
        assert "default" not in message and "GPU" not in message


def test_a_budget_check_names_the_default_it_takes_for_the_gpu_class():
    requested = {"method": "dflash", "model": DFLASH, "num_speculative_tokens": 8191}
    # K + 1 = 8192 slots: vLLM's 8192 on an H100 fails, 16384 on a B200 does not; the GPU unknown: a warning for some
    h100 = "H100/H200 class (70-160 GiB)"
    message = str(fail(requested, gpu_class=h100))
    assert "at most 8190 with max_num_batched_tokens 8192 (vLLM's default for %s): " % h100 in message
    assert "under 70 GiB" not in message
    b200 = validate_speculative_config(requested, gpu_class="GPUs of 160 GiB and more")["warnings"]
    assert not [warning for warning in b200 if "max_num_batched_tokens" in warning]
    warning = [w for w in validate_speculative_config(requested)["warnings"] if "max_num_batched_tokens" in w][0]
    assert (
        "2048 (vLLM's default for GPUs under 70 GiB and A100)" in warning
        and "(vLLM's default for %s)" % h100 in warning
    )
    # --max-num-seqs given, --max-num-batched-tokens not: the words name the one default taken
    lora = fail(
        {"method": "dflash", "model": DFLASH, "num_speculative_tokens": 15},
        extra_args=["--enable-lora", "--max-num-seqs", "1024"],
        gpu_class=h100,
    )
    assert "max_num_batched_tokens 8192 and max_num_seqs 1024 (max_num_batched_tokens: vLLM's default for %s)" % (
        h100
    ) in str(lora)


@pytest.mark.parametrize(
    "name, total_mib, expected",
    [
        ("NVIDIA H100 80GB HBM3", 81559, "H100/H200 class (70-160 GiB)"),
        ("NVIDIA H200", 143771, "H100/H200 class (70-160 GiB)"),
        ("NVIDIA A100-SXM4-80GB", 81920, "GPUs under 70 GiB and A100"),
        ("NVIDIA L40S", 46068, "GPUs under 70 GiB and A100"),
        ("NVIDIA B200", 183359, "GPUs of 160 GiB and more"),
        ("NVIDIA GB10", None, None),
        (None, 81559, None),
    ],
)
def test_the_gpu_class_of_vllms_batch_defaults(name, total_mib, expected):
    assert batch_class(name, total_mib) == expected


def test_dflash_budget_with_lora_and_the_default_batch_sizes():
    requested = {"method": "dflash", "model": DFLASH, "num_speculative_tokens": 15}
    # 2048 < 256 x 16, 8192 < 1024 x 16 and 16384 <= 1024 x 16 fails only for the first two: a warning
    result = validate_speculative_config(requested, extra_args=["--enable-lora"])
    assert "max_num_seqs x (K + 1) = 256 x 16 = 4096" in result["warnings"][0]
    error = fail(requested, extra_args=["--enable-lora", "--max-num-batched-tokens", "4096", "--max-num-seqs", "512"])
    assert "max_num_seqs x (K + 1) = 512 x 16 = 8192" in str(error) and "at most 7 with --enable-lora" in str(error)


def test_dflash_budget_that_lowers_concurrency_warns():
    result = validate_speculative_config(
        {"method": "dflash", "model": DFLASH, "num_speculative_tokens": 15},
        extra_args=["--max-num-batched-tokens", "2048", "--max-num-seqs", "256"],
    )
    assert "2048 // (K + 1 = 16) = 128 < max_num_seqs 256" in result["warnings"][0]
    assert "serves at most 128 requests at once" in result["warnings"][0]


def test_disable_log_stats_with_an_acceptance_gate_is_refused():
    requested = {"method": "dflash", "model": DFLASH}
    error = fail(requested, extra_args=["--disable-log-stats"], acceptance_gate=True)
    assert [(m["field"], m["requested"]) for m in error.mismatches] == [("extra_args", "--disable-log-stats")]
    assert "no vllm:spec_decode_* counters" in str(error)
    result = validate_speculative_config(requested, extra_args=["--disable_log_stats"])
    assert any("acceptance cannot be watched" in warning for warning in result["warnings"])
    assert validate_speculative_config(requested, acceptance_gate=True)["warnings"] == []
