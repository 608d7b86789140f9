# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Per-method checks of a speculative config against its drafter: EAGLE, EAGLE-3, MTP, ngram, token budget.

The results go into a Report (one entry per field); DFlash has its own module, _speculative_dflash.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_vllm import V2_RUNNER_ENV, VllmFacts
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_parse import (
    DrafterConfig,
    Mismatch,
    ServerArgs,
    SpecConfig,
    SpeculativeConfigError,
    value_text,
)

# What a check found for a field (the module's RETURN: checks[].status).
CheckStatus = Literal["ok", "filled", "from_drafter", "warning", "mismatch"]
# The kind of drafter a config.json describes (drafter_kind).
DrafterKind = Literal["dflash", "eagle3", "eagle", "mtp", "causal_lm"]
# A budget case: (GPU class, max_num_batched_tokens, max_num_seqs, the words that say which of them are vLLM's
# defaults for that class: "" where the check reads only the server's own values).
_Case = Tuple[str, int, int, str]
# _lookahead's (slots per request, what K adds to them or None, their name in a message).
_Slots = Tuple[int, Optional[int], str]

COLLAPSE = "no error is raised, acceptance collapses"


class Check(TypedDict):
    """One checked field: what was requested, what the drafter (or vLLM) defines, the finding and its reason."""

    field: str
    status: CheckStatus
    requested: Any
    drafter: Any
    detail: str


class Report:
    """Per-field results collected while checking: checks, mismatches, warnings, filled fields, environment; `facts`:
    the tables of the vLLM release checked against (_speculative_vllm.facts)."""

    def __init__(self, facts: VllmFacts) -> None:
        self.facts = facts
        self.checks: List[Check] = []
        self.mismatches: List[Mismatch] = []
        self.warnings: List[str] = []
        self.filled: List[str] = []
        self.environment: Dict[str, str] = {}

    def _check(self, field: str, status: CheckStatus, requested: object, drafter: object, detail: str) -> None:
        self.checks.append(
            {"field": field, "status": status, "requested": requested, "drafter": drafter, "detail": detail}
        )

    def ok(self, field: str, requested: object, drafter: object, detail: str = "") -> None:
        self._check(field, "ok", requested, drafter, detail)

    def from_drafter(self, field: str, drafter: object, detail: str = "") -> None:
        self._check(field, "from_drafter", None, drafter, detail)

    def fill(self, spec: SpecConfig, field: str, value: object, detail: str) -> None:
        spec[field] = value
        self.filled.append(field)
        self._check(field, "filled", None, value, detail)

    def warn(self, field: str, requested: object, drafter: object, detail: str) -> None:
        self.warnings.append("%s: %s" % (field, detail))
        self._check(field, "warning", requested, drafter, detail)

    def mismatch(self, field: str, requested: object, drafter: object, explanation: str) -> None:
        self.mismatches.append(
            {
                "field": field,
                "requested": requested,
                "drafter": drafter,
                "explanation": explanation,
                "source": "drafter",
            }
        )
        self._check(field, "mismatch", requested, drafter, explanation)

    def refuse(self, field: str, requested: object, expected: object, explanation: str) -> None:
        """A value vLLM itself refuses at start (not a drafter mismatch): ``expected`` is what vLLM accepts."""
        self.mismatches.append(
            {"field": field, "requested": requested, "drafter": expected, "explanation": explanation, "source": "vllm"}
        )
        self._check(field, "mismatch", requested, expected, explanation)

    def compare(self, field: str, requested: object, drafter: object, explanation: str, detail: str = "") -> None:
        """Record requested vs drafter: from_drafter when not requested, ok when equal, else a mismatch."""
        if requested is None:
            self.from_drafter(field, drafter, detail)
        elif requested == drafter:
            self.ok(field, requested, drafter, detail)
        else:
            self.mismatch(field, requested, drafter, explanation)


def layout_text(per_layer: Sequence[object]) -> str:
    """'4 x sliding_attention + 1 x full_attention' for a per-layer list (runs of equal values)."""
    runs: List[List[Any]] = []
    for value in per_layer:
        if runs and runs[-1][1] == value:
            runs[-1][0] += 1
        else:
            runs.append([1, value])
    return " + ".join("%d x %s" % (count, value) for count, value in runs)


def format_mismatches(mismatches: Sequence[Mismatch], version: str) -> str:
    """One line per mismatch: '- field: requested X, drafter Y: explanation' (vLLM `version`'s refusals: '- field: X;
    vLLM <version> expects Y: explanation')."""
    lines = []
    for item in mismatches:
        requested, drafter = item["requested"], item["drafter"]
        if item["field"] == "layer_types":
            requested = layout_text(requested) if isinstance(requested, list) else requested
            drafter = layout_text(drafter) if isinstance(drafter, list) else drafter
        if item.get("source") == "vllm":
            lines.append(
                "- %s: %s; vLLM %s expects %s: %s"
                % (item["field"], value_text(requested), version, value_text(drafter), item["explanation"])
            )
        else:
            lines.append(
                "- %s: requested %s, drafter %s: %s"
                % (item["field"], value_text(requested), value_text(drafter), item["explanation"])
            )
    return "\n".join(lines)


def _architectures(config: DrafterConfig) -> List[str]:
    names = config.get("architectures") or []
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


def _text_config_value(config: DrafterConfig, name: str) -> Any:
    """``config[name]``, else ``config["text_config"][name]`` (multimodal checkpoints nest the text model)."""
    if config.get(name) is not None:
        return config[name]
    text_config = config.get("text_config")
    return text_config.get(name) if isinstance(text_config, dict) else None


def _mtp_layers(config: DrafterConfig) -> Tuple[Optional[int], Optional[str]]:
    """(number of MTP layers, key it came from) declared by a checkpoint, or (None, None)."""
    for key in ("n_predict", "num_nextn_predict_layers", "mtp_num_hidden_layers"):
        value = _text_config_value(config, key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, key
    return None, None


def speculators_token_count(config: DrafterConfig) -> Optional[int]:
    """num_speculative_tokens a speculators-format checkpoint declares (speculators_config.proposal_methods), or None."""
    speculators = config.get("speculators_config")
    methods = speculators.get("proposal_methods") if isinstance(speculators, dict) else None
    for proposal in methods if isinstance(methods, list) else []:
        tokens = proposal.get("speculative_tokens") if isinstance(proposal, dict) else None
        if isinstance(tokens, int):
            return tokens
    return None


def drafter_kind(config: DrafterConfig) -> Optional[DrafterKind]:
    """What kind of drafter a config.json describes: 'dflash', 'eagle3', 'eagle', 'mtp', 'causal_lm' or None.

    'causal_lm' is a plain *ForCausalLM checkpoint without any marker: EAGLE-1 heads ship that way.
    EAGLE-3 is recognised by an Eagle3 architecture name, the speculators algorithm, or draft_vocab_size
    (EAGLE-3 heads predict over a reduced vocabulary).
    """
    architectures = _architectures(config)
    names = [name.lower() for name in architectures + [str(config.get("model_type") or "")]]
    speculators = config.get("speculators_config")
    algorithm = str(
        (speculators.get("algorithm") if isinstance(speculators, dict) else None)
        or config.get("speculators_model_type")
        or ""
    ).lower()
    if "dflash_config" in config or algorithm in ("dflash", "dflash2") or any("dflash" in name for name in names):
        return "dflash"
    if algorithm == "eagle3" or any("eagle3" in name for name in names):
        return "eagle3"
    if algorithm == "eagle" or any("eagle" in name for name in names):
        return "eagle"
    if _mtp_layers(config)[0] or any("mtp" in name for name in names):
        return "mtp"
    if any(name.endswith("ForCausalLM") for name in architectures):
        return "eagle3" if "draft_vocab_size" in config else "causal_lm"
    return None


def check_drafter_kind(report: Report, method: str, config: DrafterConfig) -> bool:
    """Record whether the checkpoint's kind fits ``method``; return False when it does not (further checks are moot)."""
    kind = drafter_kind(config)
    architectures = _architectures(config)
    if kind == method:
        report.ok("method", method, architectures, "config.json describes a %s drafter" % method)
        return True
    if kind == "causal_lm" and method in ("eagle", "eagle3"):
        if method == "eagle3":
            report.warn(
                "method",
                method,
                architectures,
                "architecture carries no EAGLE-3 marker (Eagle3 name, speculators "
                "algorithm, draft_vocab_size); vLLM loads it as an EAGLE-3 head: make sure it was trained as one",
            )
        else:
            report.ok("method", method, architectures, "plain *ForCausalLM architecture: EAGLE-1 heads ship that way")
        return True
    if kind is None:
        explanation = (
            "config.json names no architecture vLLM could use as a %s drafter; vLLM fails to build or load it" % method
        )
    elif method == "mtp":
        explanation = (
            "config.json declares no MTP layers (num_nextn_predict_layers, mtp_num_hidden_layers, n_predict) "
            "and looks like a %s drafter; vLLM's mtp method needs a checkpoint that carries MTP weights" % kind
        )
    else:
        explanation = (
            "config.json describes a %s drafter; vLLM builds a %s drafter from it: weights fail to load or the "
            "drafts are all rejected" % (kind, method)
        )
    report.mismatch("method", method, kind or architectures, explanation)
    return False


def target_layer_count(report: Report, config: DrafterConfig, target_num_layers: Optional[int]) -> Optional[int]:
    """Number of target layers to check tap ids against: the option, else the drafter's num_target_layers."""
    trained_for = config.get("num_target_layers")
    if not isinstance(trained_for, int) or isinstance(trained_for, bool):
        trained_for = None
    if trained_for is not None:
        report.compare(
            "target_num_layers",
            target_num_layers,
            trained_for,
            "the drafter was trained on a %s-layer target; on a %s-layer target its hidden-state taps sit at "
            "other depths (or it is another model): %s" % (trained_for, target_num_layers, COLLAPSE),
            "num_target_layers in config.json",
        )
    return target_num_layers if target_num_layers is not None else trained_for


def untappable(layer_ids: Sequence[int], num_layers: int) -> List[int]:
    """DFlash ids whose output vLLM cannot tap on a target of ``num_layers`` layers (tap id + 1 must be <= num_layers)."""
    return [layer_id for layer_id in layer_ids if layer_id + 1 > num_layers]


def tap_explanation(layer_ids: Sequence[int], num_layers: int) -> str:
    bad = untappable(layer_ids, num_layers)
    if not bad:
        return ""
    return (
        " Layer(s) %s: vLLM would tap hidden state(s) %s, but on a %d-layer target vLLM captures only hidden "
        "states 0..%d (state %d is the last layer's output, before the final norm): the drafter gets fewer "
        "features than its input projection expects and vLLM fails ('target_layer_ids reference layers that do "
        "not exist in the target model')."
        % (value_text(bad), value_text([layer_id + 1 for layer_id in bad]), num_layers, num_layers, num_layers)
    )


def int_list(value: object) -> Optional[List[int]]:
    """``value`` when it is a non-empty list of non-negative ints, else None."""
    if (
        isinstance(value, (list, tuple))
        and value
        and all(isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in value)
    ):
        return list(value)
    return None


def v1_runner_forced(environment: Optional[Mapping[str, Any]], facts: VllmFacts) -> Tuple[bool, Optional[str]]:
    """(forced, problem): whether ``environment`` forces vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0).

    vllm/envs.py (0.32, 0.33) reads the variable with ``bool(int(value))``: unset -> V2 (the default), 0 -> V1,
    another integer -> V2; a value that is no integer makes vLLM fail at start (``problem`` says so). A release
    without a V1 runner (0.34) does not read it: never forced, no problem.
    """
    value = (environment or {}).get(V2_RUNNER_ENV)
    if value is None or not facts.v1_runner:
        return False, None
    try:
        return int(str(value).strip()) == 0, None
    except ValueError:
        return False, (
            "%s=%s: vLLM reads it with int(), so this value makes the server fail at start; use 1 (V2 model "
            "runner, the default) or 0 (V1)" % (V2_RUNNER_ENV, value)
        )


def check_eagle(
    report: Report, spec: SpecConfig, method: str, config: DrafterConfig, target_num_layers: Optional[int]
) -> None:
    """EAGLE / EAGLE-3: architecture, num_speculative_tokens default, EAGLE-3 aux layer ids within the target."""
    if not check_drafter_kind(report, method, config):
        return
    declared = speculators_token_count(config)
    if declared is None and isinstance(config.get("n_predict"), int):
        declared = config["n_predict"]
    if spec.get("num_speculative_tokens") is None:
        if declared is None:
            raise SpeculativeConfigError(
                "num_speculative_tokens is not given and the drafter declares none "
                "(speculators_config.proposal_methods[].speculative_tokens or n_predict)"
            )
        report.fill(spec, "num_speculative_tokens", declared, "declared by the drafter's config.json")
    else:
        report.ok("num_speculative_tokens", spec["num_speculative_tokens"], declared)
    aux_ids = config.get("eagle_aux_hidden_state_layer_ids")
    if method == "eagle3" and isinstance(aux_ids, list):
        num_layers = target_num_layers if target_num_layers is not None else config.get("num_target_layers")
        beyond = [layer_id for layer_id in aux_ids if isinstance(num_layers, int) and layer_id > num_layers]
        if beyond and isinstance(num_layers, int):  # beyond is empty unless num_layers is an int
            report.mismatch(
                "eagle_aux_hidden_state_layer_ids",
                None,
                aux_ids,
                "vLLM captures hidden state j after target layer j - 1 and only for j = 0..%d (state %d is "
                "the last layer's output, before the final norm) on a %d-layer target, so %s are never "
                "captured: the head gets fewer features than it was trained on and vLLM fails"
                % (num_layers, num_layers, num_layers, value_text(beyond)),
            )
        else:
            report.from_drafter(
                "eagle_aux_hidden_state_layer_ids",
                aux_ids,
                "hidden states vLLM taps (j = output of target layer j - 1; valid up to the layer count)",
            )


def check_mtp(report: Report, spec: SpecConfig, config: DrafterConfig) -> None:
    """MTP: the checkpoint declares MTP layers; num_speculative_tokens defaults to, and must be a multiple of, their number."""
    if not check_drafter_kind(report, "mtp", config):
        return
    n_predict, key = _mtp_layers(config)
    requested = spec.get("num_speculative_tokens")
    if n_predict is None:
        if requested is None:
            raise SpeculativeConfigError(
                "num_speculative_tokens is not given and the checkpoint declares no number "
                "of MTP layers (num_nextn_predict_layers, mtp_num_hidden_layers, n_predict)"
            )
        report.ok("num_speculative_tokens", requested, None)
    elif requested is None:
        report.fill(spec, "num_speculative_tokens", n_predict, "%s in config.json" % key)
    elif requested > n_predict and requested % n_predict:
        report.mismatch(
            "num_speculative_tokens",
            requested,
            "%d or a multiple of it (%s)" % (n_predict, key),
            "vLLM reuses the %d MTP layer(s) in turn and refuses to start unless num_speculative_tokens is "
            "at most %d or a multiple of it" % (n_predict, n_predict),
        )
    elif requested > n_predict:
        report.warn(
            "num_speculative_tokens",
            requested,
            n_predict,
            "more tokens than MTP layers (%d): vLLM runs the same layers again for the later positions, "
            "their acceptance is usually low" % n_predict,
        )
    else:
        report.ok("num_speculative_tokens", requested, n_predict)


def check_ngram(report: Report, spec: SpecConfig) -> None:
    if spec.get("num_speculative_tokens") is None:
        raise SpeculativeConfigError("ngram needs num_speculative_tokens: there is no drafter to take it from")
    low, high = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
    if low is not None and high is not None and low > high:
        raise SpeculativeConfigError("prompt_lookup_min (%d) must be <= prompt_lookup_max (%d)" % (low, high))
    report.ok(
        "num_speculative_tokens", spec["num_speculative_tokens"], None, "ngram drafts from the prompt, no drafter model"
    )


def disable_log_stats_message(version: str) -> str:
    """Why ``--disable-log-stats`` and an acceptance gate cannot go together on vLLM `version`."""
    return (
        "--disable-log-stats makes vLLM %s create no stat loggers (vllm/v1/engine/async_llm.py: no "
        "StatLoggerManager without log_stats), so /metrics has no vllm:spec_decode_* counters at all: the "
        "acceptance of the drafter cannot be measured. Remove --disable-log-stats from the server's arguments, or "
        "configure no acceptance gate" % version
    )


def _lookahead(method: str, tokens: int, facts: VllmFacts, parallel: bool = False) -> _Slots:
    """(slots, offset, words): the token slots per request that max_num_batched_tokens must exceed, what K adds to
    them (slots = K + offset; offset None: K does not count) and their name in a message.

    facts.budget_rule "num_lookahead_tokens" (0.33, 0.34; vllm/config/vllm.py num_lookahead_tokens): K + 1 for
    DFlash (a bonus query plus K mask queries), K for the EAGLE family, MTP and draft models, 0 for the methods that
    need no drafter forward. "max_num_new_slots_for_drafting" (0.32; vllm/config/speculative.py): K for DFlash, with
    parallel_drafting K for a draft model and K - 1 for another method, else 1 for a draft model and 0 otherwise."""
    if facts.budget_rule == "num_lookahead_tokens":
        if method == "dflash":
            return tokens + 1, 1, "K + 1 = %d query tokens" % (tokens + 1)
        if method in ("eagle", "eagle3", "mtp", "draft_model"):
            return tokens, 0, "K = %d query tokens" % tokens
        return 0, None, ""
    if method == "dflash" or (parallel and method == "draft_model"):
        return tokens, 0, "K = %d new slots" % tokens
    if parallel:
        return tokens - 1, -1, "K - 1 = %d new slots" % (tokens - 1)
    if method == "draft_model":
        return 1, None, "1 new slot"
    return 0, None, ""


def _cases(facts: VllmFacts, server: ServerArgs, uses_seqs: bool, gpu_class: Optional[str]) -> List[_Case]:
    """The budget cases of a check that reads max_num_batched_tokens (and max_num_seqs where `uses_seqs`): one with
    the server's own values where it gives them all, else one per GPU class (only `gpu_class` where it is known) with
    vLLM's defaults for the values not given, named in the case's words."""
    given = {"max_num_batched_tokens": server["max_num_batched_tokens"], "max_num_seqs": server["max_num_seqs"]}
    read = ["max_num_batched_tokens"] + (["max_num_seqs"] if uses_seqs else [])
    defaulted = [name for name in read if not given[name]]
    cases: List[_Case] = []
    for label, batched, seqs in facts.batch_defaults:
        if defaulted and gpu_class not in (None, label):
            continue
        if not defaulted:
            words = ""
        elif defaulted == read:
            words = " (vLLM's default%s for %s)" % ("s" if len(read) > 1 else "", label)
        else:
            words = " (%s: vLLM's default for %s)" % (defaulted[0], label)
        cases.append((label, given["max_num_batched_tokens"] or batched, given["max_num_seqs"] or seqs, words))
        if not defaulted:
            break
    return cases


def _slots_message(case: _Case, method: str, slots: _Slots, version: str) -> str:
    """A budget case whose max_num_batched_tokens leaves no slot beyond the `slots` (_lookahead) per request: vLLM
    fails."""
    count, offset, words = slots
    return (
        "%s with max_num_batched_tokens %d%s: %s takes %s per request and vLLM %s refuses to start when "
        "max_num_batched_tokens <= %d ('VllmConfig does not have enough slots to schedule a token and support the "
        "speculative decoding settings'); raise --max-num-batched-tokens above %d%s"
        % (
            "at most %d" % (case[1] - offset - 1) if offset is not None else "no value",
            case[1],
            case[3],
            method,
            words,
            version,
            count,
            count,
            " or lower num_speculative_tokens" if offset is not None else "",
        )
    )


def _lora_message(case: _Case, tokens: int, version: str) -> str:
    """A budget case below max_num_seqs x (K + 1) with --enable-lora: vLLM fails."""
    return (
        "at most %d with --enable-lora, max_num_batched_tokens %d and max_num_seqs %d%s: vLLM %s refuses to start "
        "when max_num_batched_tokens < max_num_seqs x (K + 1) = %d x %d = %d ('Consider increasing "
        "max_num_batched_tokens or decreasing num_speculative_tokens')"
        % (case[1] // case[2] - 1, case[1], case[2], case[3], version, case[2], tokens + 1, case[2] * (tokens + 1))
    )


def _dflash_seqs_message(case: _Case, lookahead: int, version: str) -> str:
    """A DFlash budget case whose max_num_batched_tokens // (K + 1) is below max_num_seqs: vLLM serves fewer at once."""
    return (
        "max_num_batched_tokens %d // (K + 1 = %d) = %d < max_num_seqs %d%s: vLLM %s starts but serves at most %d "
        "requests at once (it lowers max_num_active_seqs; the DFlash draft pass needs K + 1 query tokens per "
        "request)" % (case[1], lookahead, case[1] // lookahead, case[2], case[3], version, case[1] // lookahead)
    )


def check_budget(report: Report, method: str, spec: SpecConfig, server: ServerArgs, gpu_class: Optional[str]) -> None:
    """vLLM's start-up checks of the token budget against num_speculative_tokens (vllm-project/vllm#50708).

    vllm/config/vllm.py _set_max_num_scheduled_tokens: max_num_batched_tokens at most the per-request slots
    (_lookahead) fails at start; from 0.33, for DFlash, max_num_batched_tokens // (K + 1) below max_num_seqs lowers
    the number of requests served at once (a warning). vllm/engine/arg_utils.py: with --enable-lora,
    max_num_batched_tokens < max_num_seqs x (K + 1) fails. K is spec's num_speculative_tokens (an int). A value not
    given takes vLLM's default for the GPU class (`gpu_class`, _speculative_vllm.batch_class; None: not known): a check
    fails when it fails for every class it considers, and warns when it fails for some.
    """
    facts, tokens = report.facts, int(spec["num_speculative_tokens"])
    slots = _lookahead(method, tokens, facts, bool(spec.get("parallel_drafting")))
    if not slots[0]:
        return
    version, lookahead = facts.version, slots[0]

    def judge(
        uses_seqs: bool, fails: Callable[[_Case], bool], message: Callable[[_Case], str], warning_only: bool = False
    ) -> None:
        cases = _cases(facts, server, uses_seqs, gpu_class)
        failing = [case for case in cases if fails(case)]
        if not failing:
            return
        if len(failing) == len(cases) and not warning_only:
            expected, explanation = message(failing[0]).split(": ", 1)
            report.refuse("num_speculative_tokens", tokens, expected, explanation)
        else:
            report.warn("num_speculative_tokens", tokens, None, "; ".join(message(case) for case in failing))

    judge(False, lambda case: case[1] <= lookahead, lambda case: _slots_message(case, method, slots, version))
    if server["enable_lora"]:
        judge(True, lambda case: case[1] < case[2] * (tokens + 1), lambda case: _lora_message(case, tokens, version))
    if method == "dflash" and facts.dflash_active_seqs and (server["max_num_batched_tokens"] or server["max_num_seqs"]):
        judge(
            True,
            lambda case: case[1] // lookahead < case[2],
            lambda case: _dflash_seqs_message(case, lookahead, version),
            warning_only=True,
        )
