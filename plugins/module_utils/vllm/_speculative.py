# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Checking a vLLM ``--speculative-config`` against the drafter's config.json, the way a vLLM release reads it.

vLLM reads most of what a drafter needs from the drafter's own config.json; a wrong guess
there rarely fails: the server starts and the acceptance rate collapses. The functions here
compare what an operator asks for with what the drafter defines, one field at a time, and refuse
what the instance's vLLM release (0.32 to 0.34) itself refuses at start, before anything is stopped.

The work is split on its seams: _speculative_vllm (the fact tables of each vLLM release, checked against its wheel
by ``make check-vllm-source``), _speculative_parse (method, field names and types of the request),
_speculative_checks (per-method checks and the token budget), _speculative_dflash (DFlash). This module ties
them together in validate_speculative_config.

Sources (vLLM 0.33.0 wheel, and what 0.32.0 and 0.34.0 change: _speculative_vllm): vllm/config/speculative.py
(fields, methods, ``*_mtp`` rewrite), vllm/config/utils.py (``extra="forbid"``: unknown fields fail), vllm/model_executor/models/qwen3_dflash.py
(DFlash attention layout, causality, mask token), vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py (V2
runner) and vllm/v1/worker/gpu_model_runner.py (V1 runner): where the tapped target layers come from,
vllm/transformers_utils/configs/speculators/algos.py (speculators-format drafters), vllm/model_executor/models/
llama.py (which hidden states exist), vllm/config/vllm.py (model runner choice, DFlash token budget).

Layer numbering (DFlash). ``dflash_config.target_layer_ids`` are 0-based target layer indices
whose *output* the drafter was trained on. vLLM numbers the hidden states it can capture 0..N for a
target of N layers (state j is the output of layer j - 1, state N the last layer's output before the
final norm) and taps ``id + 1`` for a DFlash id. Requested ``target_layer_ids`` are compared with the
drafter's on the DFlash basis (both 0-based, as in config.json); the vLLM taps (id + 1) are reported
next to them. vLLM's own lookup order of the taps (V2 runner: the default in 0.32 and 0.33, the only one in 0.34):
top-level ``eagle_aux_hidden_state_layer_ids`` (vLLM basis), ``dflash_config.target_layer_ids`` + 1,
``dspark_target_layer_ids`` + 1, top-level ``target_layer_ids`` + 1, ``dflash_config.layer_ids`` /
``eagle_config.layer_ids``. The V1 runner reads only the first two, then lets
``eagle_config.eagle_aux_hidden_state_layer_ids`` replace them.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, Mapping, NoReturn, Optional, Sequence, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_versions import VERSIONS, Release
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_vllm import (
    SUPPORTED_METHODS,
    DFLASH_DRAFTER_FIELDS,
    DISABLE_LOG_STATS,
    NEWEST,
    facts as vllm_facts,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_parse import (
    DrafterReader,
    Mismatch,
    SpecConfig,
    SpeculativeConfigError,
    infer_method,
    parse_requested,
    read_drafter,
    parse_server_args,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_checks import (
    Check,
    Report,
    format_mismatches,
    check_eagle,
    check_mtp,
    check_ngram,
    disable_log_stats_message,
    check_budget,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_dflash import check_dflash

__all__ = ["SpeculativeConfigError", "SpeculativeResult", "validate_speculative_config"]


class SpeculativeResult(TypedDict):
    """What validate_speculative_config returns (the module's RETURN, plus the warnings it turns into warnings)."""

    speculative_config: SpecConfig
    speculative_config_json: str
    environment: Dict[str, str]
    filled: List[str]
    checks: List[Check]
    warnings: List[str]
    drafter_config: Optional[str]
    vllm_version: Release


def validate_speculative_config(
    requested: object,
    drafter_config: Optional[str] = None,
    target_num_layers: Optional[int] = None,
    allow_fields: Sequence[str] = (),
    extra_args: Optional[Iterable[object]] = None,
    environment: Optional[Mapping[str, Any]] = None,
    acceptance_gate: bool = False,
    reader: DrafterReader = read_drafter,
    vllm_version: Optional[str] = None,
    gpu_class: Optional[str] = None,
) -> SpeculativeResult:
    """Validate a requested speculative config against its drafter and vLLM `vllm_version`; fill in what it defines.

    ``requested``: dict as for ``--speculative-config`` plus, for dflash, DFLASH_DRAFTER_FIELDS (expectations
    checked against config.json, not passed to vLLM). ``drafter_config``: path of the drafter's config.json or its
    directory (default <model>/config.json; required for mtp without model, the target's own checkpoint).
    ``target_num_layers``: layer count of the target model, to check hidden-state taps against. ``extra_args``:
    further ``vllm serve`` arguments (token budget, --enable-lora, --disable-log-stats); ``environment``: the
    server's environment (VLLM_USE_V2_MODEL_RUNNER); ``acceptance_gate``: a gate reads the spec-decode metrics
    (refuses --disable-log-stats). ``reader(model, drafter_config)``: (path, config dict) of the drafter's
    config.json; by default from this host's disk. ``vllm_version``: the release of VERSIONS whose facts apply
    (default: newest; the role's: _vllm_versions.resolve). ``gpu_class``: _speculative_vllm.batch_class's. Returns
    {"speculative_config" (dict for vLLM), "speculative_config_json" (compact JSON of it), "environment" (env vars
    the server needs), "filled" (fields taken from the drafter), "checks" (list of {"field", "status":
    ok|filled|from_drafter|warning|mismatch, "requested", "drafter", "detail"}), "warnings" (list of str),
    "drafter_config" (path read, None without a drafter), "vllm_version"}. Raises SpeculativeConfigError; for field
    mismatches and refusals its ``mismatches`` holds every one of them.
    """
    facts = vllm_facts(vllm_version)
    notes: List[str] = []
    spec = parse_requested(requested, allow_fields, notes, facts)
    server = parse_server_args(extra_args)
    if target_num_layers is not None and target_num_layers < 1:
        raise SpeculativeConfigError("target_num_layers must be >= 1, got %d" % target_num_layers)
    report = Report(facts)
    for note in notes:
        report.warn(note.split(":", 1)[0], None, None, note.split(": ", 1)[1])
    method, path = _method_of(report, spec, drafter_config, reader)
    path = _check_drafter(report, spec, method, drafter_config, target_num_layers, environment, reader) or path
    if isinstance(spec.get("num_speculative_tokens"), int):
        check_budget(report, method, spec, server, gpu_class)
    if server["disable_log_stats"]:
        _check_log_stats(report, acceptance_gate)
    if report.mismatches:
        _raise_mismatches(report.mismatches, path, facts.version)
    vllm_config = dict(
        (name, value) for name, value in spec.items() if not (method == "dflash" and name in DFLASH_DRAFTER_FIELDS)
    )
    return {
        "speculative_config": vllm_config,
        "speculative_config_json": json.dumps(vllm_config, separators=(",", ":")),
        "environment": report.environment,
        "filled": report.filled,
        "checks": report.checks,
        "warnings": report.warnings,
        "drafter_config": path,
        "vllm_version": facts.version,
    }


def _check_log_stats(report: Report, acceptance_gate: bool) -> None:
    """A server started with --disable-log-stats: refused with an acceptance gate (it reads the spec-decode metrics),
    else a warning that the drafter's acceptance cannot be watched."""
    if acceptance_gate:
        report.refuse(
            "extra_args",
            DISABLE_LOG_STATS,
            "no %s with an acceptance gate" % DISABLE_LOG_STATS,
            disable_log_stats_message(report.facts.version),
        )
    else:
        report.warn(
            "extra_args",
            DISABLE_LOG_STATS,
            None,
            disable_log_stats_message(report.facts.version).split(": the", 1)[0]
            + ": the drafter's acceptance cannot be watched",
        )


def _raise_mismatches(mismatches: Sequence[Mismatch], path: Optional[str], version: str) -> NoReturn:
    """Raise SpeculativeConfigError with every mismatch and refusal, under a header that blames the drafter (at
    `path`, the config.json read) or vLLM `version`."""
    drafter_problems = any(item.get("source") != "vllm" for item in mismatches)
    header = (
        "speculative_config does not match the drafter%s" % (" (%s)" % path if path else "")
        if drafter_problems
        else "speculative_config is refused: vLLM %s would fail or misbehave" % version
    )
    raise SpeculativeConfigError("%s:\n%s" % (header, format_mismatches(mismatches, version)), mismatches)


def _method_of(
    report: Report, spec: SpecConfig, drafter_config: Optional[str], reader: DrafterReader
) -> Tuple[str, Optional[str]]:
    """(method, path of the config.json read or None): the requested one, or the one vLLM infers from the model
    (filled into `spec` and reported)."""
    method = spec.get("method")
    path: Optional[str] = None
    if method is None:
        method = infer_method(spec.get("model"), report.facts)
        if method == "draft_model" and spec.get("model"):
            path, config = reader(spec["model"], drafter_config)
            if str(config.get("model_type") or "") in report.facts.mtp_methods:
                method = "mtp"
        report.fill(
            spec,
            "method",
            method,
            "vLLM %s infers %s from model %s when method is not given (%s)"
            % (report.facts.version, method, spec.get("model"), report.facts.inferred_at),
        )
    return method, path


def _check_drafter(
    report: Report,
    spec: SpecConfig,
    method: str,
    drafter_config: Optional[str],
    target_num_layers: Optional[int],
    environment: Optional[Mapping[str, Any]],
    reader: DrafterReader,
) -> Optional[str]:
    """Check `spec` against its drafter's config.json for the methods with a drafter; return the path read (None for
    ngram and the methods this module checks no drafter for)."""
    if method == "ngram":
        check_ngram(report, spec)
        return None
    if method not in report.facts.methods:
        return None  # a custom method (parse_requested warned): vLLM runs it only where a plugin registers it
    if method not in SUPPORTED_METHODS:
        report.warn(
            "method",
            method,
            None,
            "vLLM %s accepts method %s; this module checks no drafter for it (only %s)"
            % (report.facts.version, method, ", ".join(SUPPORTED_METHODS)),
        )
        return None
    model = spec.get("model")
    if model is None and not (method == "mtp" and drafter_config):
        raise SpeculativeConfigError(
            "model: not given; method %s needs the drafter directory%s"
            % (
                method,
                "; for MTP layers inside the target checkpoint give drafter_config=<target>/config.json"
                if method == "mtp"
                else "",
            )
        )
    path, config = reader(model, drafter_config)
    if method == "dflash":
        check_dflash(report, spec, config, target_num_layers, environment)
    elif method == "mtp":
        check_mtp(report, spec, config)
    else:
        check_eagle(report, spec, method, config, target_num_layers)
    return path


def argument_spec() -> Dict[str, Any]:
    """vllm_speculative_config's argument spec."""
    return dict(
        speculative_config=dict(type="dict", required=True),
        drafter_config=dict(type="path"),
        target_num_layers=dict(type="int"),
        allow_fields=dict(type="list", elements="str", default=[]),
        extra_args=dict(type="list", elements="str", default=[]),
        environment=dict(type="dict", default={}),
        acceptance_gate=dict(type="bool", default=False),
        vllm_version=dict(type="str", default=NEWEST, choices=list(VERSIONS)),
    )


def run(params: Mapping[str, Any]) -> _outcome.Outcome:
    """One run of vllm_speculative_config with `params` (the module's validated options): the result of
    validate_speculative_config, its warnings apart; failed with the mismatches where the config is refused."""
    try:
        result = validate_speculative_config(
            params["speculative_config"],
            **{name: params[name] for name in argument_spec() if name != "speculative_config"},
        )
    except SpeculativeConfigError as error:
        return _outcome.Outcome(dict(msg=str(error), mismatches=error.mismatches), failed=True)
    shown = {key: value for key, value in result.items() if key != "warnings"}
    return _outcome.Outcome(dict(changed=False, **shown), warnings=result["warnings"])
