# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Checking a vLLM ``--speculative-config`` against the drafter's config.json, the way vLLM 0.33 reads it.

vLLM reads most of what a drafter needs from the drafter's own config.json; a wrong guess
there rarely fails: the server starts and the acceptance rate collapses. The functions here
compare what an operator asks for with what the drafter defines, one field at a time, and refuse
what vLLM 0.33 itself refuses at start, before anything is stopped.

Sources (vLLM 0.33.0 wheel): vllm/config/speculative.py (fields, methods, ``*_mtp`` rewrite),
vllm/config/utils.py (``extra="forbid"``: unknown fields fail), vllm/model_executor/models/qwen3_dflash.py
(DFlash attention layout, causality, mask token), vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py (V2
runner) and vllm/v1/worker/gpu_model_runner.py (V1 runner): where the tapped target layers come from,
vllm/transformers_utils/configs/speculators/algos.py (speculators-format drafters), vllm/model_executor/models/
llama.py (which hidden states exist), vllm/config/vllm.py (model runner choice, DFlash token budget).

Layer numbering (DFlash). ``dflash_config.target_layer_ids`` are 0-based target layer indices
whose *output* the drafter was trained on. vLLM numbers the hidden states it can capture 0..N for a
target of N layers (state j is the output of layer j - 1, state N the last layer's output before the
final norm) and taps ``id + 1`` for a DFlash id. Requested ``target_layer_ids`` are compared with the
drafter's on the DFlash basis (both 0-based, as in config.json); the vLLM taps (id + 1) are reported
next to them. vLLM's own lookup order of the taps (V2 runner, the default in 0.33): top-level
``eagle_aux_hidden_state_layer_ids`` (vLLM basis), ``dflash_config.target_layer_ids`` + 1,
``dspark_target_layer_ids`` + 1, top-level ``target_layer_ids`` + 1, ``dflash_config.layer_ids`` /
``eagle_config.layer_ids``. The V1 runner reads only the first two, then lets
``eagle_config.eagle_aux_hidden_state_layer_ids`` replace them.
"""
from __future__ import annotations

import json
import os

from ansible.module_utils.parsing.convert_bool import boolean

VLLM_VERSION = "0.33.0"

# Methods whose drafter this module checks.
SUPPORTED_METHODS = ("dflash", "eagle", "eagle3", "mtp", "ngram")
# vllm/config/speculative.py MTPModelTypes: accepted as method, rewritten to "mtp" with a deprecation warning.
MTP_METHODS = (
    "deepseek_mtp", "dots3_note_mtp", "mimo_mtp", "mimo_v2_mtp", "glm4_moe_mtp", "glm4_moe_lite_mtp", "glm_ocr_mtp",
    "ernie_mtp", "nemotron_h_mtp", "exaone_moe_mtp", "exaone4_5_mtp", "qwen3_next_mtp", "qwen4_exp_mtp", "qwen3_5_mtp",
    "longcat_flash_mtp", "bailing_hybrid_v3_mtp", "minimax_m3_mtp", "bailing_hybrid_mtp", "kimi_k3_mtp",
    "pangu_ultra_moe_mtp", "step3p5_mtp", "step5_mtp", "hy_v3_mtp", "hy_v4_mtp", "gemma4_mtp", "inkling_mtp",
    "glm5_next_mtp")
# vllm/config/speculative.py SpeculativeMethod (a Literal: any other value fails validation at start).
VLLM_METHODS = ("ngram", "draft_model", "suffix", "custom_class", "eagle", "eagle3", "extract_hidden_states", "mtp",
                "dflash", "ngram_gpu", "dspark") + MTP_METHODS
# Methods of older vLLM releases that 0.33 refuses.
REMOVED_METHODS = {
    "medusa": "Medusa heads are no longer a speculative method in vLLM 0.33",
    "mlp_speculator": "MLP speculators are no longer a speculative method in vLLM 0.33",
}
# Fields of vllm/config/speculative.py SpeculativeConfig that a --speculative-config may set (the class forbids
# any other; target_model_config & co. are filled by the engine).
VLLM_FIELDS = (
    "method", "model", "num_speculative_tokens", "enforce_eager", "draft_tensor_parallel_size", "quantization",
    "moe_backend", "attention_backend", "kv_cache_dtype", "max_model_len", "revision", "code_revision",
    "index_share_for_mtp_iteration", "disable_padded_drafter_batch", "disable_eagle_block_drop",
    "disable_lookahead_block_hashes", "draft_lm_head_quantization", "use_local_argmax_reduction",
    "use_heterogeneous_vocab", "prompt_lookup_max", "prompt_lookup_min", "parallel_drafting",
    "num_speculative_tokens_per_batch_size", "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob", "draft_load_config",
    "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length",
    "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk", "xpress_topc", "fly_window_size",
    "fly_entropy_threshold", "fly_entropy_top_k")
# Field names vLLM 0.33 refuses although they look right, with the reason.
REFUSED_FIELDS = {
    "tensor_parallel_size": "vLLM keeps this field only to refuse it ('not a valid argument in the speculative_config'): "
                            "the drafter's tensor parallel size is draft_tensor_parallel_size",
    "speculative_token_tree": "vLLM 0.33 has no speculative_token_tree field any more (tree drafting was removed)",
}
# What a DFlash drafter defines in its config.json: checked against the drafter, never passed to vLLM.
DFLASH_DRAFTER_FIELDS = ("target_layer_ids", "mask_token_id", "layer_types", "sliding_window", "block_size")

_FIELD_KINDS = {
    "method": "str", "model": "str", "quantization": "str", "revision": "str", "code_revision": "str",
    "attention_backend": "str", "draft_sample_method": "sample_method",
    "num_speculative_tokens": "positive_int", "draft_tensor_parallel_size": "positive_int",
    "max_model_len": "positive_int", "prompt_lookup_min": "positive_int", "prompt_lookup_max": "positive_int",
    "block_size": "positive_int", "sliding_window": "positive_int", "mask_token_id": "non_negative_int",
    "enforce_eager": "bool", "disable_padded_drafter_batch": "bool", "parallel_drafting": "bool",
    "target_layer_ids": "layer_ids", "layer_types": "layer_types",
}

SLIDING = "sliding_attention"
FULL = "full_attention"
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
_COLLAPSE = "no error is raised, acceptance collapses"
# vllm/engine/arg_utils.py get_batch_defaults, API server: (GPU class, max_num_batched_tokens, max_num_seqs)
BATCH_DEFAULTS = (("GPUs under 70 GiB and A100", 2048, 256), ("H100/H200 class (70-160 GiB)", 8192, 1024),
                  ("GPUs of 160 GiB and more", 16384, 1024))
DISABLE_LOG_STATS = "--disable-log-stats"


class SpeculativeConfigError(Exception):
    """The requested speculative config cannot be used.

    ``str(error)`` is the full explanation (one line per field for mismatches);
    ``mismatches`` is a list of {"field", "requested", "drafter", "explanation"}
    (empty when the problem is not a field mismatch: missing file, unknown method...).
    """

    def __init__(self, message, mismatches=None):
        super().__init__(message)
        self.mismatches = list(mismatches or [])


def accepted_fields(method):
    """Fields of ``speculative_config`` accepted for ``method``: vLLM 0.33's fields plus, for dflash, DFLASH_DRAFTER_FIELDS."""
    return VLLM_FIELDS + (DFLASH_DRAFTER_FIELDS if method == "dflash" else ())


def _coerce(kind, value):
    """Return ``value`` converted to ``kind``; raise ValueError saying what was expected."""
    if kind == "str":
        if not isinstance(value, str) or not value:
            raise ValueError("expected a non-empty string")
        return value
    if kind == "sample_method":
        if value not in ("greedy", "probabilistic"):
            raise ValueError("vLLM accepts greedy or probabilistic")
        return value
    if kind == "bool":
        try:
            return boolean(value, strict=True)
        except TypeError:
            raise ValueError("expected a boolean") from None
    if kind in ("positive_int", "non_negative_int"):
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ValueError("expected an integer")
        try:
            number = int(value)
        except ValueError:
            raise ValueError("expected an integer") from None
        if number < (1 if kind == "positive_int" else 0):
            raise ValueError("expected an integer >= %d" % (1 if kind == "positive_int" else 0))
        return number
    if kind == "layer_ids":
        if not isinstance(value, (list, tuple)) or not value:
            raise ValueError("expected a non-empty list of layer indices")
        return [_coerce("non_negative_int", item) for item in value]
    # layer_types: one type for every drafter layer, or a list with one type per layer
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or any(item not in (SLIDING, FULL) for item in items):
        raise ValueError("expected %s or %s, or a list of them (one per drafter layer)" % (SLIDING, FULL))
    return value if isinstance(value, str) else list(items)


def _method_problem(method):
    """Why vLLM 0.33 refuses ``method`` at start (None when it accepts it)."""
    if method in VLLM_METHODS:
        return None
    reason = REMOVED_METHODS.get(method, "")
    if not reason and isinstance(method, str) and method.endswith("_mtp"):
        reason = "vLLM 0.33 knows only its own list of per-model MTP names (rewritten to mtp); use method mtp"
    return ("speculative_config.method %r is not a method of vLLM %s%s: its method field accepts only %s and the "
            "per-model *_mtp names, and any other value fails validation when the server starts" % (
                method, VLLM_VERSION, " (%s)" % reason if reason else "", ", ".join(VLLM_METHODS[:11])))


def infer_method(model):
    """The method vLLM 0.33 picks when ``method`` is not given (vllm/config/speculative.py __post_init__), by name only.

    ``model`` "ngram" -> ngram; a dotted import path -> custom_class; a drafter path containing "eagle-" ->
    eagle, "eagle3" -> eagle3, "dflash" -> dflash, "dspark" -> dspark; else draft_model (vLLM then still
    switches to mtp when the checkpoint's model_type is an MTP type: see resolve_method).
    """
    if model in ("ngram", "[ngram]"):
        return "ngram"
    if isinstance(model, str) and "/" not in model and not model.startswith(("http://", "https://", "file://")):
        parts = model.split(".")
        if len(parts) >= 2 and all(part.isidentifier() for part in parts):
            return "custom_class"
    name = str(model or "").lower()
    for marker, method in (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"), ("dspark", "dspark")):
        if marker in name:
            return method
    return "draft_model"


def parse_requested(requested, allow_fields=(), notes=None):
    """Check the method, the field names and the value types of a requested speculative config, as vLLM 0.33 does.

    Keys are spelled with ``_`` (vLLM turns ``-`` into ``_``). ``allow_fields``: extra field names passed to vLLM
    unchecked (fields of newer vLLM releases). ``notes``: a list that receives warnings (per-model MTP method
    rewritten, fields vLLM ignores for the method). Returns a new dict with values converted (integers given as
    strings become int; a per-model MTP method becomes mtp). Raises SpeculativeConfigError listing every problem.
    """
    notes = [] if notes is None else notes
    if not isinstance(requested, dict):
        raise SpeculativeConfigError("speculative_config must be a dictionary, got %s" % type(requested).__name__)
    requested = dict((str(name).replace("-", "_"), value) for name, value in requested.items())
    method = _requested_method(requested, notes)
    _refuse_fields(requested, method, allow_fields)
    parsed, problems = {}, []
    for name, value in requested.items():
        kind = _FIELD_KINDS.get(name)
        if kind is None:  # a vLLM field this module does not check, or an allow_fields entry: vLLM validates it
            parsed[name] = value
            continue
        try:
            parsed[name] = _coerce(kind, value)
        except ValueError as error:
            problems.append("%s: %s, got %r" % (name, error, value))
    if problems:
        raise SpeculativeConfigError("speculative_config has invalid values: %s" % "; ".join(problems))
    if method in ("ngram", "ngram_gpu") and "model" in parsed:
        notes.append("model: %s drafts from the prompt's own tokens; vLLM %s ignores model=%s for it"
                     % (method, VLLM_VERSION, parsed["model"]))
    if method not in (None, "ngram", "ngram_gpu") and any(name in parsed for name in ("prompt_lookup_min", "prompt_lookup_max")):
        notes.append("prompt_lookup_min/prompt_lookup_max: only the ngram methods use them; vLLM %s sets them to 0 "
                     "for method %s" % (VLLM_VERSION, method))
    return parsed


def _requested_method(requested, notes):
    """The method of `requested` (None: vLLM infers it from the drafter model), a per-model MTP method rewritten to
    mtp in `requested` with a note. Raises SpeculativeConfigError for an unknown method, or neither method nor model."""
    method = requested.get("method")
    if method is None:
        if requested.get("model") is None:
            raise SpeculativeConfigError(
                "speculative_config has neither method nor model: vLLM needs a method (%s) or a drafter model to "
                "infer it from" % ", ".join(SUPPORTED_METHODS))
        return None
    problem = _method_problem(method)
    if problem:
        raise SpeculativeConfigError(problem)
    if method in MTP_METHODS and method != "mtp":
        notes.append("method: vLLM %s accepts %r but logs 'method `%s` is deprecated and replaced with mtp' and "
                     "runs it as mtp; passed to vLLM as mtp" % (VLLM_VERSION, method, method))
        requested["method"] = method = "mtp"
    return method


def _refuse_fields(requested, method, allow_fields):
    """Raise SpeculativeConfigError naming every field of `requested` that vLLM (or this module) refuses for `method`."""
    accepted = accepted_fields(method)
    refused = []
    for name, value in requested.items():
        if name in accepted or name in allow_fields:
            continue
        if name in REFUSED_FIELDS:
            reason = REFUSED_FIELDS[name]
        elif name in DFLASH_DRAFTER_FIELDS:
            reason = ("not a vLLM field: this module accepts it only with method dflash, as a value checked against "
                      "the drafter's config.json")
        else:
            reason = ("not a field of vLLM %s's SpeculativeConfig, whose config classes forbid unknown fields: the "
                      "server fails at start" % VLLM_VERSION)
        refused.append("%s=%s: %s" % (name, _text(value), reason))
    if refused:
        raise SpeculativeConfigError("speculative_config field(s) refused: %s. Fields vLLM %s accepts: %s%s" % (
            "; ".join(refused), VLLM_VERSION, ", ".join(VLLM_FIELDS),
            " (and, checked against config.json for dflash: %s)" % ", ".join(DFLASH_DRAFTER_FIELDS)
            if method == "dflash" else ""))


def drafter_config_path(model, drafter_config=None):
    """Path of the drafter's config.json: ``drafter_config`` (a file, or a directory holding config.json) or <model>/config.json."""
    if not drafter_config:
        return os.path.join(model, "config.json")
    return os.path.join(drafter_config, "config.json") if os.path.isdir(drafter_config) else drafter_config


def load_drafter_config(path):
    """Read a drafter config.json and return it as a dict.

    Raises SpeculativeConfigError when the file is missing, unreadable, not JSON or not an object.
    """
    if not os.path.exists(path):
        raise SpeculativeConfigError(
            "drafter config %s not found on this host. Give a local drafter directory as model (vLLM would download a "
            "Hugging Face id, this module does not), or point drafter_config at the drafter's config.json" % path)
    try:
        with open(path, "rb") as handle:
            config = json.loads(handle.read().decode("utf-8"))
    except OSError as error:
        raise SpeculativeConfigError("cannot read drafter config %s: %s" % (path, error))
    except ValueError as error:
        raise SpeculativeConfigError("drafter config %s is not valid JSON: %s" % (path, error))
    if not isinstance(config, dict):
        raise SpeculativeConfigError("drafter config %s is not a JSON object" % path)
    return config


class _Report:
    """Per-field results collected while checking: checks, mismatches, warnings, filled fields, environment."""

    def __init__(self):
        self.checks = []
        self.mismatches = []
        self.warnings = []
        self.filled = []
        self.environment = {}

    def _check(self, field, status, requested, drafter, detail):
        self.checks.append({"field": field, "status": status, "requested": requested, "drafter": drafter, "detail": detail})

    def ok(self, field, requested, drafter, detail=""):
        self._check(field, "ok", requested, drafter, detail)

    def from_drafter(self, field, drafter, detail=""):
        self._check(field, "from_drafter", None, drafter, detail)

    def fill(self, spec, field, value, detail):
        spec[field] = value
        self.filled.append(field)
        self._check(field, "filled", None, value, detail)

    def warn(self, field, requested, drafter, detail):
        self.warnings.append("%s: %s" % (field, detail))
        self._check(field, "warning", requested, drafter, detail)

    def mismatch(self, field, requested, drafter, explanation):
        self.mismatches.append({"field": field, "requested": requested, "drafter": drafter, "explanation": explanation,
                                "source": "drafter"})
        self._check(field, "mismatch", requested, drafter, explanation)

    def refuse(self, field, requested, expected, explanation):
        """A value vLLM itself refuses at start (not a drafter mismatch): ``expected`` is what vLLM accepts."""
        self.mismatches.append({"field": field, "requested": requested, "drafter": expected, "explanation": explanation,
                                "source": "vllm"})
        self._check(field, "mismatch", requested, expected, explanation)

    def compare(self, field, requested, drafter, explanation, detail=""):
        """Record requested vs drafter: from_drafter when not requested, ok when equal, else a mismatch."""
        if requested is None:
            self.from_drafter(field, drafter, detail)
        elif requested == drafter:
            self.ok(field, requested, drafter, detail)
        else:
            self.mismatch(field, requested, drafter, explanation)


def _text(value):
    """Compact rendering of a value for messages."""
    if value is None:
        return "not set"
    if isinstance(value, (list, dict, bool)):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


def _layout_text(per_layer):
    """'4 x sliding_attention + 1 x full_attention' for a per-layer list (runs of equal values)."""
    runs = []
    for value in per_layer:
        if runs and runs[-1][1] == value:
            runs[-1][0] += 1
        else:
            runs.append([1, value])
    return " + ".join("%d x %s" % (count, value) for count, value in runs)


def format_mismatches(mismatches):
    """One line per mismatch: '- field: requested X, drafter Y: explanation'."""
    lines = []
    for item in mismatches:
        requested, drafter = item["requested"], item["drafter"]
        if item["field"] == "layer_types":
            requested = _layout_text(requested) if isinstance(requested, list) else requested
            drafter = _layout_text(drafter) if isinstance(drafter, list) else drafter
        if item.get("source") == "vllm":
            lines.append("- %s: %s; vLLM %s expects %s: %s" % (
                item["field"], _text(requested), VLLM_VERSION, _text(drafter), item["explanation"]))
        else:
            lines.append("- %s: requested %s, drafter %s: %s" % (
                item["field"], _text(requested), _text(drafter), item["explanation"]))
    return "\n".join(lines)


def _architectures(config):
    names = config.get("architectures") or []
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


def _text_config_value(config, name):
    """``config[name]``, else ``config["text_config"][name]`` (multimodal checkpoints nest the text model)."""
    if config.get(name) is not None:
        return config[name]
    text_config = config.get("text_config")
    return text_config.get(name) if isinstance(text_config, dict) else None


def _mtp_layers(config):
    """(number of MTP layers, key it came from) declared by a checkpoint, or (None, None)."""
    for key in ("n_predict", "num_nextn_predict_layers", "mtp_num_hidden_layers"):
        value = _text_config_value(config, key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value, key
    return None, None


def _speculators_tokens(config):
    """num_speculative_tokens a speculators-format checkpoint declares (speculators_config.proposal_methods), or None."""
    speculators = config.get("speculators_config")
    methods = speculators.get("proposal_methods") if isinstance(speculators, dict) else None
    for proposal in methods if isinstance(methods, list) else []:
        if isinstance(proposal, dict) and isinstance(proposal.get("speculative_tokens"), int):
            return proposal["speculative_tokens"]
    return None


def drafter_kind(config):
    """What kind of drafter a config.json describes: 'dflash', 'eagle3', 'eagle', 'mtp', 'causal_lm' or None.

    'causal_lm' is a plain *ForCausalLM checkpoint without any marker: EAGLE-1 heads ship that way.
    EAGLE-3 is recognised by an Eagle3 architecture name, the speculators algorithm, or draft_vocab_size
    (EAGLE-3 heads predict over a reduced vocabulary).
    """
    architectures = _architectures(config)
    names = [name.lower() for name in architectures + [str(config.get("model_type") or "")]]
    speculators = config.get("speculators_config")
    algorithm = str((speculators.get("algorithm") if isinstance(speculators, dict) else None)
                    or config.get("speculators_model_type") or "").lower()
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


def _check_drafter_kind(report, method, config):
    """Record whether the checkpoint's kind fits ``method``; return False when it does not (further checks are moot)."""
    kind = drafter_kind(config)
    architectures = _architectures(config)
    if kind == method:
        report.ok("method", method, architectures, "config.json describes a %s drafter" % method)
        return True
    if kind == "causal_lm" and method in ("eagle", "eagle3"):
        if method == "eagle3":
            report.warn("method", method, architectures, "architecture carries no EAGLE-3 marker (Eagle3 name, speculators "
                        "algorithm, draft_vocab_size); vLLM loads it as an EAGLE-3 head: make sure it was trained as one")
        else:
            report.ok("method", method, architectures, "plain *ForCausalLM architecture: EAGLE-1 heads ship that way")
        return True
    if kind is None:
        explanation = ("config.json names no architecture vLLM could use as a %s drafter; vLLM fails to build or load it"
                       % method)
    elif method == "mtp":
        explanation = ("config.json declares no MTP layers (num_nextn_predict_layers, mtp_num_hidden_layers, n_predict) "
                       "and looks like a %s drafter; vLLM's mtp method needs a checkpoint that carries MTP weights" % kind)
    else:
        explanation = ("config.json describes a %s drafter; vLLM builds a %s drafter from it: weights fail to load or the "
                       "drafts are all rejected" % (kind, method))
    report.mismatch("method", method, kind or architectures, explanation)
    return False


def _target_layer_count(report, config, target_num_layers):
    """Number of target layers to check tap ids against: the option, else the drafter's num_target_layers."""
    trained_for = config.get("num_target_layers")
    if not isinstance(trained_for, int) or isinstance(trained_for, bool):
        trained_for = None
    if trained_for is not None:
        report.compare("target_num_layers", target_num_layers, trained_for,
                       "the drafter was trained on a %s-layer target; on a %s-layer target its hidden-state taps sit at "
                       "other depths (or it is another model): %s" % (trained_for, target_num_layers, _COLLAPSE),
                       "num_target_layers in config.json")
    return target_num_layers if target_num_layers is not None else trained_for


def _untappable(layer_ids, num_layers):
    """DFlash ids whose output vLLM cannot tap on a target of ``num_layers`` layers (tap id + 1 must be <= num_layers)."""
    return [layer_id for layer_id in layer_ids if layer_id + 1 > num_layers]


def _tap_explanation(layer_ids, num_layers):
    bad = _untappable(layer_ids, num_layers)
    if not bad:
        return ""
    return (" Layer(s) %s: vLLM would tap hidden state(s) %s, but on a %d-layer target vLLM captures only hidden "
            "states 0..%d (state %d is the last layer's output, before the final norm): the drafter gets fewer "
            "features than its input projection expects and vLLM fails ('target_layer_ids reference layers that do "
            "not exist in the target model')." % (_text(bad), _text([layer_id + 1 for layer_id in bad]), num_layers,
                                                  num_layers, num_layers))


def _int_list(value):
    """``value`` when it is a non-empty list of non-negative ints, else None."""
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(item, int) and not isinstance(item, bool) and item >= 0 for item in value):
        return list(value)
    return None


def v1_runner_forced(environment):
    """(forced, problem): whether ``environment`` forces vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0).

    vllm/envs.py reads the variable with ``bool(int(value))``: unset -> V2 (0.33's default), 0 -> V1, another
    integer -> V2; a value that is no integer makes vLLM fail at start (``problem`` says so).
    """
    value = (environment or {}).get(V2_RUNNER_ENV)
    if value is None:
        return False, None
    try:
        return int(str(value).strip()) == 0, None
    except ValueError:
        return False, ("%s=%s: vLLM reads it with int(), so this value makes the server fail at start; use 1 (V2 model "
                       "runner, the default) or 0 (V1)" % (V2_RUNNER_ENV, value))


def _dflash_taps(config, dflash_config, v1):
    """(taps vLLM uses, where they come from) following vLLM 0.33's lookup order; taps None: the target's defaults."""
    taps = _int_list(config.get("eagle_aux_hidden_state_layer_ids"))
    if taps:
        source = "eagle_aux_hidden_state_layer_ids"
    else:
        ids = _int_list(dflash_config.get("target_layer_ids"))
        taps, source = ([i + 1 for i in ids], "dflash_config.target_layer_ids + 1") if ids else (None, None)
    eagle_config = config.get("eagle_config")
    if v1:
        if isinstance(eagle_config, dict) and eagle_config:
            # gpu_model_runner.py: an eagle_config dict replaces what was found, even with no aux ids in it
            taps = _int_list(eagle_config.get("eagle_aux_hidden_state_layer_ids"))
            source = "eagle_config.eagle_aux_hidden_state_layer_ids (V1 runner)"
        return taps, source
    for key, shift in (("dspark_target_layer_ids", 1), ("target_layer_ids", 1)):
        if taps:
            break
        ids = _int_list(config.get(key))
        if ids:
            taps, source = [i + shift for i in ids], "%s + 1" % key
    for section in ("dflash_config", "eagle_config"):
        if taps:
            break
        nested = config.get(section)
        ids = _int_list(nested.get("layer_ids")) if isinstance(nested, dict) else None
        if ids:
            taps, source = ids, "%s.layer_ids" % section
    return taps, source


def _trained_ids(config, dflash_config):
    """(0-based DFlash ids the drafter was trained on, key they come from): dflash_config.target_layer_ids, else the
    top-level target_layer_ids; None when the drafter states neither."""
    for key, value in (("dflash_config.target_layer_ids", dflash_config.get("target_layer_ids")),
                       ("target_layer_ids", config.get("target_layer_ids"))):
        ids = _int_list(value)
        if ids:
            return ids, key
    return None, None


def _check_target_layer_ids(report, spec, config, dflash_config, num_layers, v1):
    """Requested vs drafter target_layer_ids (0-based, DFlash basis), the taps vLLM really uses (id + 1), their range."""
    drafter_ids, key = _trained_ids(config, dflash_config)
    requested = spec.get("target_layer_ids")
    taps, source = _dflash_taps(config, dflash_config, v1)
    if drafter_ids is None:
        if taps is None:
            report.mismatch("target_layer_ids", requested, None,
                            "config.json states no tapped target layers (dflash_config.target_layer_ids, "
                            "target_layer_ids, aux_hidden_state_layer_ids): vLLM falls back to the target model's "
                            "default layers, not what the drafter was trained on: %s" % _COLLAPSE)
            return
        drafter_ids, key = [tap - 1 for tap in taps], source
    trained_taps = [layer_id + 1 for layer_id in drafter_ids]
    if num_layers is not None and _untappable(drafter_ids, num_layers):
        report.mismatch("target_layer_ids", requested, drafter_ids,
                        "the drafter's own layer ids (%s) do not fit this target." % key
                        + _tap_explanation(drafter_ids, num_layers))
        return
    explanation = ("both are 0-based target layer indices as in dflash_config.target_layer_ids; vLLM taps hidden "
                   "state id + 1, i.e. %s instead of the trained %s. The drafter then sees hidden states of other layers "
                   "than in training: %s." % (_text([layer_id + 1 for layer_id in requested or []]), _text(trained_taps),
                                              _COLLAPSE))
    if requested is not None and len(requested) == len(drafter_ids):
        shift = {r - d for r, d in zip(requested, drafter_ids)}
        if shift in ({1}, {-1}):
            explanation += " The requested ids are the drafter's shifted by %+d: vLLM tap ids and DFlash ids got mixed up." % shift.pop()
    if requested is not None and num_layers is not None:
        explanation += _tap_explanation(requested, num_layers)
    report.compare("target_layer_ids", requested, drafter_ids, explanation,
                   "%s; vLLM taps hidden states %s (id + 1)" % (key, _text(trained_taps)))
    _check_tap_source(report, config, taps, source, (key, drafter_ids), v1)


def _check_tap_source(report, config, taps, source, trained, v1):
    """Another key of config.json that vLLM reads before (or, in V1, instead of) the trained ids."""
    if config.get("speculators_model_type"):
        return  # vLLM wrote both keys itself from aux_hidden_state_layer_ids
    key, drafter_ids = trained
    trained_taps = [layer_id + 1 for layer_id in drafter_ids]
    runner = "V1 model runner (%s=0)" % V2_RUNNER_ENV if v1 else "V2 model runner (vLLM %s's default)" % VLLM_VERSION
    eagle_config = config.get("eagle_config")
    if not v1 and isinstance(eagle_config, dict) and eagle_config.get("eagle_aux_hidden_state_layer_ids") is not None \
            and _int_list(eagle_config["eagle_aux_hidden_state_layer_ids"]) != trained_taps:
        report.warn("eagle_config.eagle_aux_hidden_state_layer_ids", eagle_config["eagle_aux_hidden_state_layer_ids"],
                    trained_taps, "the %s ignores it, but with %s=0 (V1 runner) vLLM would tap these instead of %s "
                    "(target_layer_ids + 1): remove the key" % (runner, V2_RUNNER_ENV, _text(trained_taps)))
    if source == key or source == key + " + 1":
        return  # vLLM taps what the drafter was trained on
    field = (source or "eagle_config.eagle_aux_hidden_state_layer_ids").split(" ")[0]
    if taps == trained_taps:
        report.warn(field, taps, trained_taps,
                    "config.json's %s equals target_layer_ids + 1, so vLLM taps the right layers; remove it anyway: "
                    "the %s reads it instead of %s, and a later edit of either would be silently shadowed"
                    % (field, runner, key))
        return
    if taps is None:
        explanation = ("with the %s an eagle_config without eagle_aux_hidden_state_layer_ids replaces %s: vLLM taps "
                       "the target's default layers instead of %s: %s" % (runner, key, _text(trained_taps), _COLLAPSE))
    else:
        explanation = ("config.json's %s (vLLM basis: hidden state j) takes precedence over %s in the %s, so vLLM "
                       "taps %s instead of %s (target_layer_ids + 1): %s. Remove the key or set it to %s."
                       % (field, key, runner, _text(taps), _text(trained_taps), _COLLAPSE, _text(trained_taps)))
        if taps == drafter_ids:
            explanation += " It equals target_layer_ids without the + 1: every tap is one layer early."
    report.mismatch(field, taps, trained_taps, explanation)


def _dflash_layout(config, dflash_config):
    """Attention of each drafter layer as vLLM 0.33 builds it: (layer types, window, per-layer causal flags, problem).

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
        return types, None, None, ("sliding layers need a window: vLLM fails at start ('DFlash sliding attention "
                                   "requires a window size configured in dflash_config.swa_window_size or the "
                                   "top-level sliding_window')")
    forced = next((value for value in (config.get("is_causal"), dflash_config.get("causal")) if value is not None), None)
    causal = [bool(forced)] * num_layers if forced is not None else default_causal
    return types, (window if SLIDING in types else None), causal, None


def _check_dflash_layout(report, spec, config, dflash_config, environment):
    """Requested layer_types / sliding_window vs the drafter's layout; mixed layouts and the model runner."""
    types, window, causal, problem = _dflash_layout(config, dflash_config)
    if problem:
        report.mismatch("layer_types", spec.get("layer_types"), config.get("layer_types"), problem)
        return
    requested = spec.get("layer_types")
    if isinstance(requested, str):
        requested = [requested] * len(types)
    layout = _layout_text(types) + (" (window %s)" % window if window else "")
    causal_text = _layout_text(["causal" if flag else "non-causal" for flag in causal])
    report.compare("layer_types", requested, types,
                   "the drafter's layers were trained as %s, %s; served with another layout each layer "
                   "attends to other positions than in training: %s" % (layout, causal_text, _COLLAPSE),
                   "layers %s; causality %s" % (layout, causal_text))
    if "is_causal" in dflash_config:
        stated = [bool(dflash_config["is_causal"])] * len(types)
        explanation = ("vLLM %s does not read dflash_config.is_causal (it reads the top-level is_causal, then "
                       "dflash_config.causal): the layers run %s" % (VLLM_VERSION, causal_text))
        if stated == causal:
            report.warn("dflash_config.is_causal", dflash_config["is_causal"], None, explanation + ", as stated anyway")
        else:
            report.mismatch("dflash_config.is_causal", dflash_config["is_causal"], causal_text,
                            explanation + ", not as stated: rename it to dflash_config.causal; %s" % _COLLAPSE)
    if window is not None:
        report.compare("sliding_window", spec.get("sliding_window"), window,
                       "the sliding layers were trained with a %s-token window; another window shows them other context: "
                       "%s" % (window, _COLLAPSE))
    elif spec.get("sliding_window") is not None:
        report.mismatch("sliding_window", spec["sliding_window"], None,
                        "the drafter has no sliding layer (%s): vLLM applies no window" % layout)
    num_sliding = types.count(SLIDING)
    if 0 < num_sliding < len(types):
        forced_v1, _problem = v1_runner_forced(environment)
        if forced_v1:
            report.refuse(V2_RUNNER_ENV, str(environment[V2_RUNNER_ENV]), "unset or 1",
                          "%s=0 forces vLLM's V1 model runner, and vLLM %s refuses a DFlash drafter with mixed sliding "
                          "and full attention layers (%s) on it at start ('Model Runner V1 does not support: mixed "
                          "sliding/full dflash drafts'): such a drafter needs several KV-cache groups, which only the "
                          "V2 runner supports. Remove the variable (V2 is the default) or set it to 1"
                          % (V2_RUNNER_ENV, VLLM_VERSION, layout))
        else:
            report.environment[V2_RUNNER_ENV] = "1"
            report.ok(V2_RUNNER_ENV, (environment or {}).get(V2_RUNNER_ENV), "1",
                      "mixed sliding/full drafter layers need several KV-cache groups, which only vLLM's V2 model runner "
                      "has; V2 is vLLM %s's default, and with V1 forced (%s=0) vLLM refuses this drafter at start. Set "
                      "to 1 so that vLLM fails with the reason instead of falling back to V1 when another option needs "
                      "V1" % (VLLM_VERSION, V2_RUNNER_ENV))


def _check_block_size(report, spec, config, dflash_config, speculators_tokens=None):
    """DFlash block size (dflash_config.block_size, else block_size): fills num_speculative_tokens, warns past it.

    vLLM 0.33 does not compare num_speculative_tokens with block_size: more than block_size - 1 is served (the
    extra positions were never trained and are mostly rejected), so it is a warning, not a refusal.
    """
    block_size = dflash_config.get("block_size", config.get("block_size"))
    requested_tokens = spec.get("num_speculative_tokens")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 2:
        if spec.get("block_size") is not None:
            report.mismatch("block_size", spec["block_size"], None, "config.json defines no block_size "
                            "(dflash_config.block_size or block_size): the trained block is unknown")
        if requested_tokens is None:
            if speculators_tokens is not None:
                report.fill(spec, "num_speculative_tokens", speculators_tokens,
                            "speculators_config.proposal_methods[0].speculative_tokens in config.json")
                return
            raise SpeculativeConfigError(
                "num_speculative_tokens: not given, and the drafter defines no block_size (dflash_config.block_size or "
                "block_size) to derive it from; vLLM needs it ('A speculative model was provided, but "
                "num_speculative_tokens was not provided')")
        report.warn("num_speculative_tokens", requested_tokens, None,
                    "the drafter defines no block_size: cannot check num_speculative_tokens <= block_size - 1")
        return
    report.compare("block_size", spec.get("block_size"), block_size,
                   "the drafter was trained to denoise blocks of %d positions; vLLM takes the block from config.json, "
                   "it cannot be changed at serve time" % block_size)
    if requested_tokens is None:
        report.fill(spec, "num_speculative_tokens", block_size - 1,
                    "block_size %d - 1: a block holds the last accepted token and %d drafted ones" % (block_size, block_size - 1))
    elif requested_tokens > block_size - 1:
        report.warn("num_speculative_tokens", requested_tokens, block_size - 1,
                    "more than block_size - 1 = %d: vLLM %s serves it (it does not compare the two), but the drafter "
                    "was trained to draft %d tokens per block of %d; the positions past them are mostly rejected and "
                    "cost draft compute" % (block_size - 1, VLLM_VERSION, block_size - 1, block_size))
    else:
        report.ok("num_speculative_tokens", requested_tokens, block_size - 1, "at most block_size - 1")


def speculators_to_vllm(config):
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
    dflash = {"mask_token_id": config.get("mask_token_id"),
              "causal": not config.get("sliding_window_non_causal", True)}
    if _int_list(aux):
        dflash["target_layer_ids"] = [i - 1 for i in aux]
    converted["dflash_config"] = dflash
    for key in ("block_size", "num_target_layers"):
        if key in config and key not in converted:
            converted[key] = config[key]
    return converted


def _check_dflash(report, spec, config, target_num_layers, environment):
    """DFlash: architecture, block size and num_speculative_tokens, target layers, mask token, attention layout."""
    if not _check_drafter_kind(report, "dflash", config):
        return
    speculators_tokens = _speculators_tokens(config)
    config = speculators_to_vllm(config)
    dflash_config = config.get("dflash_config") or {}
    if not isinstance(dflash_config, dict):
        report.mismatch("dflash_config", None, dflash_config, "dflash_config in config.json must be an object")
        return
    forced_v1, runner_problem = v1_runner_forced(environment)
    if runner_problem:
        report.refuse(V2_RUNNER_ENV, environment[V2_RUNNER_ENV], "0 or 1", runner_problem)

    _check_block_size(report, spec, config, dflash_config, speculators_tokens)
    num_layers = _target_layer_count(report, config, target_num_layers)
    _check_target_layer_ids(report, spec, config, dflash_config, num_layers, forced_v1)

    eagle_config = config.get("eagle_config") if isinstance(config.get("eagle_config"), dict) else {}
    merged = dict(eagle_config, **dflash_config)  # qwen3_dflash.py: eagle_config updated with dflash_config
    mask_token_id = merged.get("mask_token_id", config.get("mask_token_id"))
    if not isinstance(mask_token_id, int) or isinstance(mask_token_id, bool):
        report.mismatch("mask_token_id", spec.get("mask_token_id"), mask_token_id,
                        "config.json defines no integer dflash_config.mask_token_id (nor a top-level mask_token_id): "
                        "the drafter cannot mark the positions to draft")
    else:
        report.compare("mask_token_id", spec.get("mask_token_id"), mask_token_id,
                       "the drafter fills the positions to draft with the embedding of token %d; with another token it "
                       "denoises from an embedding it never saw in training: %s" % (mask_token_id, _COLLAPSE))
    _check_dflash_layout(report, spec, config, dflash_config, environment)


def _check_eagle(report, spec, method, config, target_num_layers):
    """EAGLE / EAGLE-3: architecture, num_speculative_tokens default, EAGLE-3 aux layer ids within the target."""
    if not _check_drafter_kind(report, method, config):
        return
    declared = _speculators_tokens(config)
    if declared is None and isinstance(config.get("n_predict"), int):
        declared = config["n_predict"]
    if spec.get("num_speculative_tokens") is None:
        if declared is None:
            raise SpeculativeConfigError("num_speculative_tokens is not given and the drafter declares none "
                                         "(speculators_config.proposal_methods[].speculative_tokens or n_predict)")
        report.fill(spec, "num_speculative_tokens", declared, "declared by the drafter's config.json")
    else:
        report.ok("num_speculative_tokens", spec["num_speculative_tokens"], declared)
    aux_ids = config.get("eagle_aux_hidden_state_layer_ids")
    if method == "eagle3" and isinstance(aux_ids, list):
        num_layers = target_num_layers if target_num_layers is not None else config.get("num_target_layers")
        beyond = [layer_id for layer_id in aux_ids if isinstance(num_layers, int) and layer_id > num_layers]
        if beyond:
            report.mismatch("eagle_aux_hidden_state_layer_ids", None, aux_ids,
                            "vLLM captures hidden state j after target layer j - 1 and only for j = 0..%d (state %d is "
                            "the last layer's output, before the final norm) on a %d-layer target, so %s are never "
                            "captured: the head gets fewer features than it was trained on and vLLM fails"
                            % (num_layers, num_layers, num_layers, _text(beyond)))
        else:
            report.from_drafter("eagle_aux_hidden_state_layer_ids", aux_ids,
                                "hidden states vLLM taps (j = output of target layer j - 1; valid up to the layer count)")


def _check_mtp(report, spec, config):
    """MTP: the checkpoint declares MTP layers; num_speculative_tokens defaults to, and must be a multiple of, their number."""
    if not _check_drafter_kind(report, "mtp", config):
        return
    n_predict, key = _mtp_layers(config)
    requested = spec.get("num_speculative_tokens")
    if n_predict is None:
        if requested is None:
            raise SpeculativeConfigError("num_speculative_tokens is not given and the checkpoint declares no number "
                                         "of MTP layers (num_nextn_predict_layers, mtp_num_hidden_layers, n_predict)")
        report.ok("num_speculative_tokens", requested, None)
    elif requested is None:
        report.fill(spec, "num_speculative_tokens", n_predict, "%s in config.json" % key)
    elif requested > n_predict and requested % n_predict:
        report.mismatch("num_speculative_tokens", requested, "%d or a multiple of it (%s)" % (n_predict, key),
                        "vLLM reuses the %d MTP layer(s) in turn and refuses to start unless num_speculative_tokens is "
                        "at most %d or a multiple of it" % (n_predict, n_predict))
    elif requested > n_predict:
        report.warn("num_speculative_tokens", requested, n_predict,
                    "more tokens than MTP layers (%d): vLLM runs the same layers again for the later positions, "
                    "their acceptance is usually low" % n_predict)
    else:
        report.ok("num_speculative_tokens", requested, n_predict)


def _check_ngram(report, spec):
    if spec.get("num_speculative_tokens") is None:
        raise SpeculativeConfigError("ngram needs num_speculative_tokens: there is no drafter to take it from")
    low, high = spec.get("prompt_lookup_min"), spec.get("prompt_lookup_max")
    if low is not None and high is not None and low > high:
        raise SpeculativeConfigError("prompt_lookup_min (%d) must be <= prompt_lookup_max (%d)" % (low, high))
    report.ok("num_speculative_tokens", spec["num_speculative_tokens"], None, "ngram drafts from the prompt, no drafter model")


def parse_server_args(args):
    """What the budget and metrics checks need from further ``vllm serve`` arguments (a list of str).

    Returns {"max_num_batched_tokens": int or None, "max_num_seqs": int or None, "enable_lora": bool,
    "disable_log_stats": bool}. ``--flag value``, ``--flag=value`` and ``--flag_name`` spellings are read as vLLM's
    parser reads them; a value that is not an integer raises SpeculativeConfigError.
    """
    found = {"max_num_batched_tokens": None, "max_num_seqs": None, "enable_lora": False, "disable_log_stats": False}
    args = [str(arg) for arg in (args or [])]
    for index, arg in enumerate(args):
        if not arg.startswith("--"):
            continue
        name, sep, value = arg[2:].partition("=")
        name = name.replace("-", "_")
        if name in ("enable_lora", "disable_log_stats"):
            found[name] = True
        elif name in ("max_num_batched_tokens", "max_num_seqs"):
            if not sep:
                value = args[index + 1] if index + 1 < len(args) else ""
            try:
                found[name] = int(value)
            except ValueError:
                raise SpeculativeConfigError("--%s %s: vLLM expects an integer there and fails at start otherwise"
                                             % (name.replace("_", "-"), value or "(no value)")) from None
    return found


def disable_log_stats_message():
    """Why ``--disable-log-stats`` and an acceptance gate cannot go together (for the role and vllm_acceptance)."""
    return ("--disable-log-stats makes vLLM %s create no stat loggers (vllm/v1/engine/async_llm.py: no "
            "StatLoggerManager without log_stats), so /metrics has no vllm:spec_decode_* counters at all: the "
            "acceptance of the drafter cannot be measured. Remove --disable-log-stats from the server's arguments, or "
            "configure no acceptance gate" % VLLM_VERSION)


def _lookahead(method, tokens):
    """vllm/config/vllm.py num_lookahead_tokens: K + 1 for DFlash (a bonus query plus K mask queries), K for the
    EAGLE family, MTP and draft models, 0 for the methods that need no drafter forward."""
    if method == "dflash":
        return tokens + 1
    if method in ("eagle", "eagle3", "mtp", "draft_model"):
        return tokens
    return 0


def _check_budget(report, method, tokens, server):
    """vLLM 0.33's start-up checks of the token budget against num_speculative_tokens (vllm-project/vllm#50708).

    vllm/config/vllm.py _set_max_num_scheduled_tokens: max_num_batched_tokens <= num_lookahead_tokens fails at start;
    for DFlash, max_num_batched_tokens // (K + 1) below max_num_seqs lowers the number of requests served at once
    (a warning). vllm/engine/arg_utils.py: with --enable-lora, max_num_batched_tokens < max_num_seqs x (K + 1) fails.
    A value not given takes vLLM's default for the GPU class, which this module does not know: a check fails when it
    fails for every class, and warns when it fails for some.
    """
    lookahead = _lookahead(method, tokens)
    if not lookahead:
        return
    given_tokens, given_seqs = server["max_num_batched_tokens"], server["max_num_seqs"]
    cases = [(label, given_tokens or batched, given_seqs or seqs, label if not (given_tokens and given_seqs) else None)
             for label, batched, seqs in BATCH_DEFAULTS]
    if given_tokens and given_seqs:
        cases = cases[:1]

    def where(case):
        return "" if case[3] is None else " (vLLM's default for %s)" % case[3]

    def judge(field, failing, message, warning_only=False):
        if not failing:
            return
        if len(failing) == len(cases) and not warning_only:
            expected, explanation = message(failing[0]).split(": ", 1)
            report.refuse(field, tokens, expected, explanation)
        else:
            report.warn(field, tokens, None, "; ".join(message(case) for case in failing))

    judge("num_speculative_tokens", [case for case in cases if case[1] <= lookahead], lambda case: (
        "at most %d with max_num_batched_tokens %d%s: %s drafts K%s = %d query tokens per request and vLLM %s refuses "
        "to start when max_num_batched_tokens <= %d ('VllmConfig does not have enough slots to schedule a token and "
        "support the speculative decoding settings'); raise --max-num-batched-tokens above %d or lower "
        "num_speculative_tokens" % (case[1] - (lookahead - tokens) - 1, case[1], where(case), method,
                                    " + 1" if method == "dflash" else "", lookahead, VLLM_VERSION, lookahead, lookahead)))
    if server["enable_lora"]:
        judge("num_speculative_tokens", [case for case in cases if case[1] < case[2] * (tokens + 1)], lambda case: (
            "at most %d with --enable-lora, max_num_batched_tokens %d and max_num_seqs %d%s: vLLM %s refuses to start "
            "when max_num_batched_tokens < max_num_seqs x (K + 1) = %d x %d = %d ('Consider increasing "
            "max_num_batched_tokens or decreasing num_speculative_tokens')" % (
                case[1] // case[2] - 1, case[1], case[2], where(case), VLLM_VERSION, case[2], tokens + 1,
                case[2] * (tokens + 1))))
    if method == "dflash" and (given_tokens or given_seqs):
        judge("num_speculative_tokens", [case for case in cases if case[1] // lookahead < case[2]], lambda case: (
            "max_num_batched_tokens %d // (K + 1 = %d) = %d < max_num_seqs %d%s: vLLM %s starts but serves at most %d "
            "requests at once (it lowers max_num_active_seqs; the DFlash draft pass needs K + 1 query tokens per "
            "request)" % (case[1], lookahead, case[1] // lookahead, case[2], where(case), VLLM_VERSION,
                          case[1] // lookahead)), warning_only=True)


def validate_speculative_config(requested, drafter_config=None, target_num_layers=None, allow_fields=(),
                                extra_args=None, environment=None, acceptance_gate=False):
    """Validate a requested vLLM speculative config against its drafter and vLLM 0.33; fill in what the drafter defines.

    ``requested``: dict as for ``--speculative-config`` plus, for dflash, DFLASH_DRAFTER_FIELDS (expectations
    checked against config.json, not passed to vLLM). ``drafter_config``: path of the drafter's config.json or its
    directory (default <model>/config.json; required for mtp without model, the target's own checkpoint).
    ``target_num_layers``: layer count of the target model, to check hidden-state taps against.
    ``extra_args``: further ``vllm serve`` arguments of the server (token budget, --enable-lora,
    --disable-log-stats); ``environment``: the server's environment (VLLM_USE_V2_MODEL_RUNNER);
    ``acceptance_gate``: an acceptance gate reads the server's spec-decode metrics (refuses --disable-log-stats).

    Returns {"speculative_config" (dict for vLLM), "speculative_config_json" (compact JSON of it), "environment"
    (env vars the server needs), "filled" (fields taken from the drafter), "checks" (list of {"field", "status":
    ok|filled|from_drafter|warning|mismatch, "requested", "drafter", "detail"}), "warnings" (list of str),
    "drafter_config" (path read, None without a drafter)}.
    Raises SpeculativeConfigError; for field mismatches and refusals its ``mismatches`` holds every one of them.
    """
    notes = []
    spec = parse_requested(requested, allow_fields, notes)
    server = parse_server_args(extra_args)
    if target_num_layers is not None and target_num_layers < 1:
        raise SpeculativeConfigError("target_num_layers must be >= 1, got %d" % target_num_layers)
    report = _Report()
    for note in notes:
        report.warn(note.split(":", 1)[0], None, None, note.split(": ", 1)[1])
    method, path = _method_of(report, spec, drafter_config)
    path = _check_drafter(report, spec, method, drafter_config, target_num_layers, environment) or path
    if isinstance(spec.get("num_speculative_tokens"), int):
        _check_budget(report, method, spec["num_speculative_tokens"], server)
    if server["disable_log_stats"]:
        if acceptance_gate:
            report.refuse("extra_args", DISABLE_LOG_STATS, "no %s with an acceptance gate" % DISABLE_LOG_STATS,
                          disable_log_stats_message())
        else:
            report.warn("extra_args", DISABLE_LOG_STATS, None, disable_log_stats_message().split(": the", 1)[0]
                        + ": the drafter's acceptance cannot be watched")
    if report.mismatches:
        drafter_problems = any(item.get("source") != "vllm" for item in report.mismatches)
        header = ("speculative_config does not match the drafter%s" % (" (%s)" % path if path else "")
                  if drafter_problems else "speculative_config is refused: vLLM %s would fail or misbehave" % VLLM_VERSION)
        raise SpeculativeConfigError("%s:\n%s" % (header, format_mismatches(report.mismatches)), report.mismatches)
    vllm_config = dict((name, value) for name, value in spec.items() if not (method == "dflash" and name in DFLASH_DRAFTER_FIELDS))
    return {
        "speculative_config": vllm_config,
        "speculative_config_json": json.dumps(vllm_config, separators=(",", ":")),
        "environment": report.environment,
        "filled": report.filled,
        "checks": report.checks,
        "warnings": report.warnings,
        "drafter_config": path,
    }


def _method_of(report, spec, drafter_config):
    """(method, path of the config.json read or None): the requested one, or the one vLLM infers from the model
    (filled into `spec` and reported)."""
    method = spec.get("method")
    path = None
    if method is None:
        method = infer_method(spec.get("model"))
        if method == "draft_model" and spec.get("model"):
            path = drafter_config_path(spec["model"], drafter_config)
            config = load_drafter_config(path)
            if str(config.get("model_type") or "") in MTP_METHODS:
                method = "mtp"
        report.fill(spec, "method", method, "vLLM %s infers %s from model %s when method is not given"
                    % (VLLM_VERSION, method, spec.get("model")))
    return method, path


def _check_drafter(report, spec, method, drafter_config, target_num_layers, environment):
    """Check `spec` against its drafter's config.json for the methods with a drafter; return the path read (None for
    ngram and the methods this module checks no drafter for)."""
    if method == "ngram":
        _check_ngram(report, spec)
        return None
    if method not in SUPPORTED_METHODS:
        report.warn("method", method, None, "vLLM %s accepts method %s; this module checks no drafter for it (only %s)"
                    % (VLLM_VERSION, method, ", ".join(SUPPORTED_METHODS)))
        return None
    model = spec.get("model")
    if model is None and not (method == "mtp" and drafter_config):
        raise SpeculativeConfigError(
            "model: not given; method %s needs the drafter directory%s" % (
                method, "; for MTP layers inside the target checkpoint give drafter_config=<target>/config.json"
                if method == "mtp" else ""))
    path = drafter_config_path(model, drafter_config)
    config = load_drafter_config(path)
    if method == "dflash":
        _check_dflash(report, spec, config, target_num_layers, environment)
    elif method == "mtp":
        _check_mtp(report, spec, config)
    else:
        _check_eagle(report, spec, method, config, target_num_layers)
    return path
