# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""DFlash checks: tapped target layers, mask token, attention layout and block size, as vLLM 0.32 to 0.34 read them.

Sources (vLLM 0.33.0 wheel; 0.32.0 and 0.34.0 read them alike): vllm/model_executor/models/qwen3_dflash.py (layout,
causality, mask token), vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py (V2 runner taps),
vllm/v1/worker/gpu_model_runner.py (V1 runner taps; 0.34 has no V1 runner), vllm/transformers_utils/configs/
speculators/algos.py (speculators-format drafters).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, cast

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_vllm import SLIDING, FULL, V2_RUNNER_ENV
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_parse import (
    DrafterConfig,
    SpecConfig,
    SpeculativeConfigError,
    value_text,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_checks import (
    Report,
    COLLAPSE,
    layout_text,
    speculators_token_count,
    check_drafter_kind,
    target_layer_count,
    untappable,
    tap_explanation,
    int_list,
    v1_runner_forced,
)

# (taps vLLM uses or None, the config.json key they come from or None): _dflash_taps.
_Taps = Tuple[Optional[List[int]], Optional[str]]
# The attention of a drafter's layers as vLLM builds it (_dflash_layout): (layer types, window, per-layer causal
# flags, problem); with a problem the first three may be None.
_Layout = Tuple[Optional[List[str]], Any, Optional[List[bool]], Optional[str]]


def _dflash_taps(config: DrafterConfig, dflash_config: DrafterConfig, v1: bool) -> _Taps:
    """(taps vLLM uses, where they come from) following vLLM's lookup order; taps None: the target's defaults."""
    taps = int_list(config.get("eagle_aux_hidden_state_layer_ids"))
    source: Optional[str]
    if taps:
        source = "eagle_aux_hidden_state_layer_ids"
    else:
        ids = int_list(dflash_config.get("target_layer_ids"))
        taps, source = ([i + 1 for i in ids], "dflash_config.target_layer_ids + 1") if ids else (None, None)
    eagle_config = config.get("eagle_config")
    if v1:
        if isinstance(eagle_config, dict) and eagle_config:
            # gpu_model_runner.py: an eagle_config dict replaces what was found, even with no aux ids in it
            taps = int_list(eagle_config.get("eagle_aux_hidden_state_layer_ids"))
            source = "eagle_config.eagle_aux_hidden_state_layer_ids (V1 runner)"
        return taps, source
    for key, shift in (("dspark_target_layer_ids", 1), ("target_layer_ids", 1)):
        if taps:
            break
        ids = int_list(config.get(key))
        if ids:
            taps, source = [i + shift for i in ids], "%s + 1" % key
    for section in ("dflash_config", "eagle_config"):
        if taps:
            break
        nested = config.get(section)
        ids = int_list(nested.get("layer_ids")) if isinstance(nested, dict) else None
        if ids:
            taps, source = ids, "%s.layer_ids" % section
    return taps, source


def _trained_ids(config: DrafterConfig, dflash_config: DrafterConfig) -> Tuple[Optional[List[int]], Optional[str]]:
    """(0-based DFlash ids the drafter was trained on, key they come from): dflash_config.target_layer_ids, else the
    top-level target_layer_ids; None when the drafter states neither."""
    for key, value in (
        ("dflash_config.target_layer_ids", dflash_config.get("target_layer_ids")),
        ("target_layer_ids", config.get("target_layer_ids")),
    ):
        ids = int_list(value)
        if ids:
            return ids, key
    return None, None


def _check_target_layer_ids(
    report: Report,
    spec: SpecConfig,
    config: DrafterConfig,
    dflash_config: DrafterConfig,
    num_layers: Optional[int],
    v1: bool,
) -> None:
    """Requested vs drafter target_layer_ids (0-based, DFlash basis), the taps vLLM really uses (id + 1), their range."""
    drafter_ids, key = _trained_ids(config, dflash_config)
    requested = spec.get("target_layer_ids")
    taps, source = _dflash_taps(config, dflash_config, v1)
    if drafter_ids is None:
        if taps is None:
            report.mismatch(
                "target_layer_ids",
                requested,
                None,
                "config.json states no tapped target layers (dflash_config.target_layer_ids, "
                "target_layer_ids, aux_hidden_state_layer_ids): vLLM falls back to the target model's "
                "default layers, not what the drafter was trained on: %s" % COLLAPSE,
            )
            return
        drafter_ids, key = [tap - 1 for tap in taps], source
    trained_taps = [layer_id + 1 for layer_id in drafter_ids]
    if num_layers is not None and untappable(drafter_ids, num_layers):
        report.mismatch(
            "target_layer_ids",
            requested,
            drafter_ids,
            "the drafter's own layer ids (%s) do not fit this target." % key + tap_explanation(drafter_ids, num_layers),
        )
        return
    explanation = (
        "both are 0-based target layer indices as in dflash_config.target_layer_ids; vLLM taps hidden "
        "state id + 1, i.e. %s instead of the trained %s. The drafter then sees hidden states of other layers "
        "than in training: %s."
        % (value_text([layer_id + 1 for layer_id in requested or []]), value_text(trained_taps), COLLAPSE)
    )
    if requested is not None and len(requested) == len(drafter_ids):
        shift = {r - d for r, d in zip(requested, drafter_ids)}
        if shift in ({1}, {-1}):
            explanation += (
                " The requested ids are the drafter's shifted by %+d: vLLM tap ids and DFlash ids got mixed up."
                % shift.pop()
            )
    if requested is not None and num_layers is not None:
        explanation += tap_explanation(requested, num_layers)
    report.compare(
        "target_layer_ids",
        requested,
        drafter_ids,
        explanation,
        "%s; vLLM taps hidden states %s (id + 1)" % (key, value_text(trained_taps)),
    )
    # key names where drafter_ids came from: None only with no ids, which returned above
    _check_tap_source(report, config, taps, source, (cast(str, key), drafter_ids), v1)


def _check_tap_source(
    report: Report,
    config: DrafterConfig,
    taps: Optional[List[int]],
    source: Optional[str],
    trained: Tuple[str, List[int]],
    v1: bool,
) -> None:
    """Another key of config.json that vLLM reads before (or, in V1, instead of) the trained ids."""
    if config.get("speculators_model_type"):
        return  # vLLM wrote both keys itself from aux_hidden_state_layer_ids
    key, drafter_ids = trained
    trained_taps = [layer_id + 1 for layer_id in drafter_ids]
    version = report.facts.version
    runner = "V1 model runner (%s=0)" % V2_RUNNER_ENV if v1 else "V2 model runner (vLLM %s's default)" % version
    eagle_config = config.get("eagle_config")
    if (
        not v1
        and report.facts.v1_runner
        and isinstance(eagle_config, dict)
        and eagle_config.get("eagle_aux_hidden_state_layer_ids") is not None
        and int_list(eagle_config["eagle_aux_hidden_state_layer_ids"]) != trained_taps
    ):
        report.warn(
            "eagle_config.eagle_aux_hidden_state_layer_ids",
            eagle_config["eagle_aux_hidden_state_layer_ids"],
            trained_taps,
            "the %s ignores it, but with %s=0 (V1 runner) vLLM would tap these instead of %s "
            "(target_layer_ids + 1): remove the key" % (runner, V2_RUNNER_ENV, value_text(trained_taps)),
        )
    if source == key or source == key + " + 1":
        return  # vLLM taps what the drafter was trained on
    field = (source or "eagle_config.eagle_aux_hidden_state_layer_ids").split(" ")[0]
    if taps == trained_taps:
        report.warn(
            field,
            taps,
            trained_taps,
            "config.json's %s equals target_layer_ids + 1, so vLLM taps the right layers; remove it anyway: "
            "the %s reads it instead of %s, and a later edit of either would be silently shadowed"
            % (field, runner, key),
        )
        return
    if taps is None:
        explanation = (
            "with the %s an eagle_config without eagle_aux_hidden_state_layer_ids replaces %s: vLLM taps "
            "the target's default layers instead of %s: %s" % (runner, key, value_text(trained_taps), COLLAPSE)
        )
    else:
        explanation = (
            "config.json's %s (vLLM basis: hidden state j) takes precedence over %s in the %s, so vLLM "
            "taps %s instead of %s (target_layer_ids + 1): %s. Remove the key or set it to %s."
            % (field, key, runner, value_text(taps), value_text(trained_taps), COLLAPSE, value_text(trained_taps))
        )
        if taps == drafter_ids:
            explanation += " It equals target_layer_ids without the + 1: every tap is one layer early."
    report.mismatch(field, taps, trained_taps, explanation)


def _dflash_layout(config: DrafterConfig, dflash_config: DrafterConfig) -> _Layout:
    """Attention of each drafter layer as vLLM builds it: (layer types, window, per-layer causal flags, problem).

    vllm/model_executor/models/qwen3_dflash.py: layer_types[i] picks sliding or full attention, unless layer_types
    is absent (or has no sliding layer) and dflash_config.use_swa is set, which makes every layer sliding; the
    window is dflash_config.swa_window_size, else the top-level sliding_window. Causality: top-level is_causal,
    else dflash_config.causal, else sliding layers causal and full layers not (no layer_types: non-causal).
    """
    layer_types = config.get("layer_types")
    num_layers = config.get("num_hidden_layers")
    if layer_types is not None:
        if not isinstance(layer_types, list) or any(layer_type not in (SLIDING, FULL) for layer_type in layer_types):
            return None, None, None, "layer_types must list %s or %s per drafter layer" % (SLIDING, FULL)
        if isinstance(num_layers, int) and len(layer_types) != num_layers:
            return None, None, None, "layer_types has %d entries for %d drafter layers" % (len(layer_types), num_layers)
        num_layers = len(layer_types)
    if not isinstance(num_layers, int) or num_layers < 1:
        return None, None, None, "config.json gives neither num_hidden_layers nor layer_types"
    use_swa = bool(dflash_config.get("use_swa", False))
    if layer_types is None or (use_swa and SLIDING not in layer_types):
        types = [SLIDING if use_swa else FULL] * num_layers
    else:
        types = list(layer_types)
    default_causal = [bool(layer_types) and layer_type == SLIDING for layer_type in (layer_types or types)]
    window = dflash_config.get("swa_window_size", config.get("sliding_window"))
    if SLIDING in types and window is None:
        return (
            types,
            None,
            None,
            (
                "sliding layers need a window: vLLM fails at start ('DFlash sliding attention "
                "requires a window size configured in dflash_config.swa_window_size or the "
                "top-level sliding_window')"
            ),
        )
    forced = next(
        (value for value in (config.get("is_causal"), dflash_config.get("causal")) if value is not None), None
    )
    causal = [bool(forced)] * num_layers if forced is not None else default_causal
    return types, (window if SLIDING in types else None), causal, None


def _check_dflash_layout(
    report: Report,
    spec: SpecConfig,
    config: DrafterConfig,
    dflash_config: DrafterConfig,
    environment: Mapping[str, Any],
) -> None:
    """Requested layer_types / sliding_window vs the drafter's layout; mixed layouts and the model runner."""
    types, window, causal, problem = _dflash_layout(config, dflash_config)
    if problem:
        report.mismatch("layer_types", spec.get("layer_types"), config.get("layer_types"), problem)
        return
    types, causal = cast(List[str], types), cast(List[bool], causal)  # set whenever there is no problem
    requested = spec.get("layer_types")
    if isinstance(requested, str):
        requested = [requested] * len(types)
    layout = layout_text(types) + (" (window %s)" % window if window else "")
    causal_text = layout_text(["causal" if flag else "non-causal" for flag in causal])
    report.compare(
        "layer_types",
        requested,
        types,
        "the drafter's layers were trained as %s, %s; served with another layout each layer "
        "attends to other positions than in training: %s" % (layout, causal_text, COLLAPSE),
        "layers %s; causality %s" % (layout, causal_text),
    )
    if "is_causal" in dflash_config:
        _check_is_causal(report, dflash_config["is_causal"], len(types), causal, causal_text)
    if window is not None:
        report.compare(
            "sliding_window",
            spec.get("sliding_window"),
            window,
            "the sliding layers were trained with a %s-token window; another window shows them other context: "
            "%s" % (window, COLLAPSE),
        )
    elif spec.get("sliding_window") is not None:
        report.mismatch(
            "sliding_window",
            spec["sliding_window"],
            None,
            "the drafter has no sliding layer (%s): vLLM applies no window" % layout,
        )
    num_sliding = types.count(SLIDING)
    if 0 < num_sliding < len(types):
        _check_mixed_layout_runner(report, environment, layout)


def _check_is_causal(
    report: Report, is_causal: object, num_layers: int, causal: Sequence[bool], causal_text: str
) -> None:
    """dflash_config.is_causal, which vLLM does not read: a warning where all `num_layers` layers run as it states
    (`causal`: one flag a layer, in words `causal_text`), a mismatch where they do not."""
    stated = [bool(is_causal)] * num_layers
    explanation = (
        "vLLM %s does not read dflash_config.is_causal (it reads the top-level is_causal, then "
        "dflash_config.causal): the layers run %s" % (report.facts.version, causal_text)
    )
    if stated == causal:
        report.warn("dflash_config.is_causal", is_causal, None, explanation + ", as stated anyway")
    else:
        report.mismatch(
            "dflash_config.is_causal",
            is_causal,
            causal_text,
            explanation + ", not as stated: rename it to dflash_config.causal; %s" % COLLAPSE,
        )


def _check_mixed_layout_runner(report: Report, environment: Mapping[str, Any], layout: str) -> None:
    """A drafter with mixed sliding and full layers (`layout`, in words) needs vLLM's V2 model runner: refused where
    `environment` forces V1, else VLLM_USE_V2_MODEL_RUNNER=1 is set for the server. A release without a V1 runner
    (0.34) runs it as it is."""
    version = report.facts.version
    if not report.facts.v1_runner:
        report.ok("layer_types", None, layout, "vLLM %s has only the V2 model runner, which runs it" % version)
        return
    forced_v1, _problem = v1_runner_forced(environment, report.facts)
    if forced_v1:
        report.refuse(
            V2_RUNNER_ENV,
            str(environment[V2_RUNNER_ENV]),
            "unset or 1",
            "%s=0 forces vLLM's V1 model runner, and vLLM %s refuses a DFlash drafter with mixed sliding "
            "and full attention layers (%s) on it at start ('Model Runner V1 does not support: mixed "
            "sliding/full dflash drafts'): such a drafter needs several KV-cache groups, which only the "
            "V2 runner supports. Remove the variable (V2 is the default) or set it to 1"
            % (V2_RUNNER_ENV, version, layout),
        )
    else:
        report.environment[V2_RUNNER_ENV] = "1"
        report.ok(
            V2_RUNNER_ENV,
            (environment or {}).get(V2_RUNNER_ENV),
            "1",
            "mixed sliding/full drafter layers need several KV-cache groups, which only vLLM's V2 model runner "
            "has; V2 is vLLM %s's default, and with V1 forced (%s=0) vLLM refuses this drafter at start. Set "
            "to 1 so that vLLM fails with the reason instead of falling back to V1 when another option needs "
            "V1" % (version, V2_RUNNER_ENV),
        )


def _no_block_size(
    report: Report, spec: SpecConfig, requested_tokens: Optional[int], speculators_tokens: Optional[int]
) -> None:
    """_check_block_size for a drafter that defines no usable block size: a requested block_size is a mismatch, and
    num_speculative_tokens comes from speculators_config or must be given (it cannot be checked then)."""
    if spec.get("block_size") is not None:
        report.mismatch(
            "block_size",
            spec["block_size"],
            None,
            "config.json defines no block_size (dflash_config.block_size or block_size): the trained block is unknown",
        )
    if requested_tokens is None:
        if speculators_tokens is not None:
            report.fill(
                spec,
                "num_speculative_tokens",
                speculators_tokens,
                "speculators_config.proposal_methods[0].speculative_tokens in config.json",
            )
            return
        raise SpeculativeConfigError(
            "num_speculative_tokens: not given, and the drafter defines no block_size (dflash_config.block_size or "
            "block_size) to derive it from; vLLM needs it ('A speculative model was provided, but "
            "num_speculative_tokens was not provided')"
        )
    report.warn(
        "num_speculative_tokens",
        requested_tokens,
        None,
        "the drafter defines no block_size: cannot check num_speculative_tokens <= block_size - 1",
    )


def _check_block_size(
    report: Report,
    spec: SpecConfig,
    config: DrafterConfig,
    dflash_config: DrafterConfig,
    speculators_tokens: Optional[int] = None,
) -> None:
    """DFlash block size (dflash_config.block_size, else block_size): fills num_speculative_tokens, warns past it.

    vLLM (0.32 to 0.34) does not compare num_speculative_tokens with block_size: more than block_size - 1 is served (the
    extra positions were never trained and are mostly rejected), so it is a warning, not a refusal.
    """
    block_size = dflash_config.get("block_size", config.get("block_size"))
    requested_tokens = spec.get("num_speculative_tokens")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 2:
        _no_block_size(report, spec, requested_tokens, speculators_tokens)
        return
    report.compare(
        "block_size",
        spec.get("block_size"),
        block_size,
        "the drafter was trained to denoise blocks of %d positions; vLLM takes the block from config.json, "
        "it cannot be changed at serve time" % block_size,
    )
    if requested_tokens is None:
        report.fill(
            spec,
            "num_speculative_tokens",
            block_size - 1,
            "block_size %d - 1: a block holds the last accepted token and %d drafted ones"
            % (block_size, block_size - 1),
        )
    elif requested_tokens > block_size - 1:
        report.warn(
            "num_speculative_tokens",
            requested_tokens,
            block_size - 1,
            "more than block_size - 1 = %d: vLLM %s serves it (it does not compare the two), but the drafter "
            "was trained to draft %d tokens per block of %d; the positions past them are mostly rejected and "
            "cost draft compute" % (block_size - 1, report.facts.version, block_size - 1, block_size),
        )
    else:
        report.ok("num_speculative_tokens", requested_tokens, block_size - 1, "at most block_size - 1")


def speculators_to_vllm(config: DrafterConfig) -> DrafterConfig:
    """A speculators-format DFlash config.json as vLLM sees it (vllm/transformers_utils/configs/speculators/algos.py
    update_dflash): transformer_layer_config plus eagle_aux_hidden_state_layer_ids = aux_hidden_state_layer_ids and
    dflash_config {mask_token_id, target_layer_ids: aux - 1, causal: not sliding_window_non_causal (default True)}.
    Other configs are returned unchanged."""
    if str(config.get("speculators_model_type") or "").lower() not in ("dflash", "dflash2"):
        return config
    layer_config = config.get("transformer_layer_config")
    converted = dict(layer_config) if isinstance(layer_config, dict) else {}
    converted["architectures"] = ["DFlashDraftModel"]
    converted["speculators_model_type"] = config["speculators_model_type"]
    converted["speculators_config"] = config.get("speculators_config")
    aux = config.get("aux_hidden_state_layer_ids")
    if aux is not None:
        converted["eagle_aux_hidden_state_layer_ids"] = aux
    dflash: Dict[str, Any] = {
        "mask_token_id": config.get("mask_token_id"),
        "causal": not config.get("sliding_window_non_causal", True),
    }
    aux_ids = int_list(aux)
    if aux_ids:
        dflash["target_layer_ids"] = [i - 1 for i in aux_ids]
    converted["dflash_config"] = dflash
    for key in ("block_size", "num_target_layers"):
        if key in config and key not in converted:
            converted[key] = config[key]
    return converted


def check_dflash(
    report: Report,
    spec: SpecConfig,
    config: DrafterConfig,
    target_num_layers: Optional[int],
    environment: Optional[Mapping[str, Any]],
) -> None:
    """DFlash: architecture, block size and num_speculative_tokens, target layers, mask token, attention layout."""
    if not check_drafter_kind(report, "dflash", config):
        return
    environment = environment or {}  # as vLLM reads it: no environment, no variables set
    speculators_tokens = speculators_token_count(config)
    config = speculators_to_vllm(config)
    dflash_config = config.get("dflash_config") or {}
    if not isinstance(dflash_config, dict):
        report.mismatch("dflash_config", None, dflash_config, "dflash_config in config.json must be an object")
        return
    forced_v1, runner_problem = v1_runner_forced(environment, report.facts)
    if runner_problem:
        report.refuse(V2_RUNNER_ENV, environment[V2_RUNNER_ENV], "0 or 1", runner_problem)
    elif not report.facts.v1_runner and V2_RUNNER_ENV in (environment or {}):
        report.warn(
            V2_RUNNER_ENV,
            environment[V2_RUNNER_ENV],
            None,
            "vLLM %s has no V1 model runner and does not read %s: remove it" % (report.facts.version, V2_RUNNER_ENV),
        )

    _check_block_size(report, spec, config, dflash_config, speculators_tokens)
    num_layers = target_layer_count(report, config, target_num_layers)
    _check_target_layer_ids(report, spec, config, dflash_config, num_layers, forced_v1)

    eagle_config = config.get("eagle_config")
    if not isinstance(eagle_config, dict):
        eagle_config = {}
    merged = dict(eagle_config, **dflash_config)  # qwen3_dflash.py: eagle_config updated with dflash_config
    mask_token_id = merged.get("mask_token_id", config.get("mask_token_id"))
    if not isinstance(mask_token_id, int) or isinstance(mask_token_id, bool):
        report.mismatch(
            "mask_token_id",
            spec.get("mask_token_id"),
            mask_token_id,
            "config.json defines no integer dflash_config.mask_token_id (nor a top-level mask_token_id): "
            "the drafter cannot mark the positions to draft",
        )
    else:
        report.compare(
            "mask_token_id",
            spec.get("mask_token_id"),
            mask_token_id,
            "the drafter fills the positions to draft with the embedding of token %d; with another token it "
            "denoises from an embedding it never saw in training: %s" % (mask_token_id, COLLAPSE),
        )
    _check_dflash_layout(report, spec, config, dflash_config, environment)
