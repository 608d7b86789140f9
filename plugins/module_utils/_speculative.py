# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Checking a vLLM ``--speculative-config`` against the drafter's config.json.

vLLM reads most of what a drafter needs from the drafter's own config.json; a wrong guess
there rarely fails: the server starts and the acceptance rate collapses. The functions here
compare what an operator asks for with what the drafter defines, one field at a time.

Layer numbering (DFlash). ``dflash_config.target_layer_ids`` are 0-based target layer indices
whose *output* the drafter was trained on (the reference code takes
``output_hidden_states[id + 1]``, entry 0 being the embeddings). vLLM captures auxiliary hidden
states at the *input* of a target layer (the residual stream entering layer ``j``), so for a
DFlash id it taps ``j = id + 1``: same tensor, numbers one higher. Requested
``target_layer_ids`` are compared with the drafter's on the DFlash basis (both 0-based, as in
config.json); the vLLM taps (id + 1) are reported next to them. Because vLLM only captures
inputs of existing layers, the output of the last target layer (id ``num_target_layers - 1``)
cannot be tapped. A top-level (or ``eagle_config``) ``eagle_aux_hidden_state_layer_ids`` key in
the drafter's config.json is on vLLM's basis and wins over ``dflash_config.target_layer_ids``.
"""
from __future__ import annotations

import json
import os

from ansible.module_utils.parsing.convert_bool import boolean

SUPPORTED_METHODS = ("dflash", "eagle", "eagle3", "mtp", "ngram")

_GENERAL_FIELDS = ("method", "num_speculative_tokens", "enforce_eager")
_DRAFT_MODEL_FIELDS = ("model", "draft_tensor_parallel_size", "quantization", "max_model_len", "revision",
                       "code_revision", "attention_backend", "draft_sample_method", "disable_padded_drafter_batch")
_EAGLE_FIELDS = ("speculative_token_tree", "parallel_drafting")
_NGRAM_FIELDS = ("prompt_lookup_min", "prompt_lookup_max")
# What a DFlash drafter defines in its config.json: checked against the drafter, never passed to vLLM.
DFLASH_DRAFTER_FIELDS = ("target_layer_ids", "mask_token_id", "layer_types", "sliding_window", "block_size")

_FIELD_KINDS = {
    "method": "str", "model": "str", "quantization": "str", "revision": "str", "code_revision": "str",
    "attention_backend": "str", "draft_sample_method": "str", "speculative_token_tree": "str",
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
    """Fields of ``speculative_config`` accepted for ``method`` (vLLM's fields plus, for dflash, DFLASH_DRAFTER_FIELDS)."""
    if method == "ngram":
        return _GENERAL_FIELDS + _NGRAM_FIELDS
    fields = _GENERAL_FIELDS + _DRAFT_MODEL_FIELDS
    if method in ("eagle", "eagle3"):
        fields += _EAGLE_FIELDS
    if method == "dflash":
        fields += DFLASH_DRAFTER_FIELDS
    return fields


def _coerce(kind, value):
    """Return ``value`` converted to ``kind``; raise ValueError saying what was expected."""
    if kind == "str":
        if not isinstance(value, str) or not value:
            raise ValueError("expected a non-empty string")
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


def parse_requested(requested, allow_fields=()):
    """Check the method, the field names and the value types of a requested speculative config.

    ``allow_fields``: extra field names passed to vLLM unchecked (fields of newer vLLM releases).
    Returns a new dict with values converted (integers given as strings become int).
    Raises SpeculativeConfigError listing every problem found.
    """
    if not isinstance(requested, dict):
        raise SpeculativeConfigError("speculative_config must be a dictionary, got %s" % type(requested).__name__)
    method = requested.get("method")
    if method is None:
        raise SpeculativeConfigError("speculative_config has no method; supported methods: %s" % ", ".join(SUPPORTED_METHODS))
    if method not in SUPPORTED_METHODS:
        hint = ""
        if isinstance(method, str) and method.endswith("_mtp"):
            hint = " (vLLM replaced the per-model MTP method names with 'mtp')"
        raise SpeculativeConfigError("speculative_config method %r is not supported%s; supported methods: %s"
                                     % (method, hint, ", ".join(SUPPORTED_METHODS)))
    accepted = accepted_fields(method)
    unknown = [name for name in requested if name not in accepted and name not in allow_fields]
    if unknown:
        hints = []
        if "tensor_parallel_size" in unknown:
            hints.append("the drafter's tensor parallel size is draft_tensor_parallel_size")
        if method == "ngram" and "model" in unknown:
            hints.append("ngram drafts from the prompt's own tokens and loads no model")
        raise SpeculativeConfigError("speculative_config field(s) not accepted for method %s: %s%s. Accepted fields: %s"
                                     % (method, ", ".join(unknown), "".join(" (%s)" % hint for hint in hints),
                                        ", ".join(accepted)))
    parsed, problems = {}, []
    for name, value in requested.items():
        kind = _FIELD_KINDS.get(name)
        if kind is None:  # an allow_fields entry: vLLM validates it
            parsed[name] = value
            continue
        try:
            parsed[name] = _coerce(kind, value)
        except ValueError as error:
            problems.append("%s: %s, got %r" % (name, error, value))
    if problems:
        raise SpeculativeConfigError("speculative_config has invalid values: %s" % "; ".join(problems))
    return parsed


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
        self.mismatches.append({"field": field, "requested": requested, "drafter": drafter, "explanation": explanation})
        self._check(field, "mismatch", requested, drafter, explanation)

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
        lines.append("- %s: requested %s, drafter %s: %s" % (item["field"], _text(requested), _text(drafter), item["explanation"]))
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
    if "dflash_config" in config or any("dflash" in name for name in names):
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
    """Ids whose output vLLM cannot tap on a target of ``num_layers`` layers (tap id + 1 must be an existing layer)."""
    return [layer_id for layer_id in layer_ids if layer_id + 1 >= num_layers]


def _tap_explanation(layer_ids, num_layers):
    bad = _untappable(layer_ids, num_layers)
    if not bad:
        return ""
    return (" Layer(s) %s: vLLM would tap layer(s) %s, but the target's layers are 0..%d: vLLM cannot tap the "
            "output of the last layer or of layers beyond it." % (_text(bad), _text([layer_id + 1 for layer_id in bad]), num_layers - 1))


def _check_target_layer_ids(report, spec, dflash_config, num_layers):
    """Requested vs drafter target_layer_ids (0-based, DFlash basis), plus the vLLM taps (id + 1)."""
    drafter_ids = dflash_config.get("target_layer_ids")
    requested = spec.get("target_layer_ids")
    if not isinstance(drafter_ids, list) or not drafter_ids or not all(
            isinstance(layer_id, int) and not isinstance(layer_id, bool) and layer_id >= 0 for layer_id in drafter_ids):
        report.mismatch("target_layer_ids", requested, drafter_ids,
                        "config.json has no valid dflash_config.target_layer_ids (non-empty list of 0-based layer "
                        "indices); vLLM then taps layers the drafter was not trained on")
        return None
    taps = [layer_id + 1 for layer_id in drafter_ids]
    if num_layers is not None and _untappable(drafter_ids, num_layers):
        report.mismatch("target_layer_ids", requested, drafter_ids,
                        "the drafter's own layer ids do not fit this target." + _tap_explanation(drafter_ids, num_layers))
        return drafter_ids
    explanation = ("both are 0-based target layer indices as in dflash_config.target_layer_ids; vLLM taps the hidden "
                   "state entering layer id + 1, i.e. %s instead of the trained %s. The drafter then sees hidden states "
                   "of other layers than in training: %s."
                   % (_text([layer_id + 1 for layer_id in requested or []]), _text(taps), _COLLAPSE))
    if requested is not None and len(requested) == len(drafter_ids):
        shift = {r - d for r, d in zip(requested, drafter_ids)}
        if shift in ({1}, {-1}):
            explanation += " The requested ids are the drafter's shifted by %+d: vLLM tap ids and DFlash ids got mixed up." % shift.pop()
    if requested is not None and num_layers is not None:
        explanation += _tap_explanation(requested, num_layers)
    report.compare("target_layer_ids", requested, drafter_ids, explanation,
                   "vLLM taps the hidden states entering target layers %s (target_layer_ids + 1)" % _text(taps))
    return drafter_ids


def _check_stale_aux_ids(report, config, drafter_ids):
    """A leftover eagle_aux_hidden_state_layer_ids wins over dflash_config.target_layer_ids in vLLM.

    Equal to target_layer_ids + 1 (what vLLM derives anyway): a warning. Anything else: a mismatch.
    """
    eagle_config = config.get("eagle_config")
    location, stale = "eagle_aux_hidden_state_layer_ids", config.get("eagle_aux_hidden_state_layer_ids")
    if not stale and isinstance(eagle_config, dict) and eagle_config.get("eagle_aux_hidden_state_layer_ids"):
        location, stale = "eagle_config.eagle_aux_hidden_state_layer_ids", eagle_config["eagle_aux_hidden_state_layer_ids"]
    if not stale or drafter_ids is None:
        return
    expected = [layer_id + 1 for layer_id in drafter_ids]
    if stale == expected:
        report.warn(location, stale, expected,
                    "config.json's %s equals target_layer_ids + 1, so vLLM taps the right layers; remove it anyway: vLLM "
                    "uses it instead of dflash_config.target_layer_ids, and a later edit of either would be silently "
                    "shadowed" % location)
        return
    explanation = ("config.json's %s (vLLM basis: hidden state entering layer j) takes precedence over "
                   "dflash_config.target_layer_ids in vLLM, so vLLM taps %s instead of %s (target_layer_ids + 1): %s. "
                   "Remove the key or set it to %s." % (location, _text(stale), _text(expected), _COLLAPSE, _text(expected)))
    if stale == drafter_ids:
        explanation += " It equals target_layer_ids without the + 1: every tap is one layer early."
    report.mismatch(location, stale, expected, explanation)


def _dflash_layout(config, dflash_config):
    """Attention of each drafter layer as vLLM builds it: (layer types, window, per-layer causal flags, problem or None).

    vLLM's rules: layer_types[i] picks sliding or full attention, unless layer_types is absent (or has no sliding
    layer) and dflash_config.use_swa is set, which makes every layer sliding; the window is
    dflash_config.swa_window_size or the top-level sliding_window. Causality: top-level is_causal, then
    dflash_config.is_causal, then dflash_config.causal, else sliding layers causal and full layers not
    (non-causal everywhere when use_swa forces the sliding layout).
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
        default_causal = [False] * num_layers
    else:
        types = list(layer_types)
        default_causal = [layer_type == SLIDING for layer_type in types]
    window = dflash_config.get("swa_window_size", config.get("sliding_window"))
    if SLIDING in types and window is None:
        return types, None, None, ("sliding layers need a window (dflash_config.swa_window_size or sliding_window); "
                                   "vLLM refuses to start without one")
    forced = next((value for value in (config.get("is_causal"), dflash_config.get("is_causal"), dflash_config.get("causal"))
                   if value is not None), None)
    causal = [bool(forced)] * num_layers if forced is not None else default_causal
    return types, (window if SLIDING in types else None), causal, None


def _check_dflash_layout(report, spec, config, dflash_config):
    """Requested layer_types / sliding_window vs the drafter's layout; mixed layouts need the V2 model runner."""
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
    if window is not None:
        report.compare("sliding_window", spec.get("sliding_window"), window,
                       "the sliding layers were trained with a %s-token window; another window shows them other context: "
                       "%s" % (window, _COLLAPSE))
    elif spec.get("sliding_window") is not None:
        report.mismatch("sliding_window", spec["sliding_window"], None,
                        "the drafter has no sliding layer (%s): vLLM applies no window" % layout)
    num_sliding = types.count(SLIDING)
    if 0 < num_sliding < len(types):
        report.environment[V2_RUNNER_ENV] = "1"
        report.ok(V2_RUNNER_ENV, None, "1", "mixed sliding/full drafter layers need several KV-cache groups, which only "
                  "vLLM's V2 model runner provides; without it vLLM refuses this layout")


def _check_block_size(report, spec, config, dflash_config):
    """DFlash block size (dflash_config.block_size, else block_size): num_speculative_tokens is at most block_size - 1."""
    block_size = dflash_config.get("block_size", config.get("block_size"))
    requested_tokens = spec.get("num_speculative_tokens")
    if not isinstance(block_size, int) or isinstance(block_size, bool) or block_size < 2:
        if spec.get("block_size") is not None:
            report.mismatch("block_size", spec["block_size"], None, "config.json defines no block_size "
                            "(dflash_config.block_size or block_size): the trained block is unknown")
        if requested_tokens is None:
            raise SpeculativeConfigError("num_speculative_tokens is not given and the drafter defines no block_size "
                                         "(dflash_config.block_size or block_size) to derive it from")
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
        report.mismatch("num_speculative_tokens", requested_tokens, "at most %d (block_size %d)" % (block_size - 1, block_size),
                        "a block of %d positions holds the last accepted token plus %d drafted tokens; the drafter was "
                        "never trained to draft past its block: the extra tokens are rejected or vLLM fails"
                        % (block_size, block_size - 1))
    else:
        report.ok("num_speculative_tokens", requested_tokens, block_size - 1, "at most block_size - 1")


def _check_dflash(report, spec, config, target_num_layers):
    """DFlash: architecture, block size and num_speculative_tokens, target layers, mask token, attention layout."""
    if not _check_drafter_kind(report, "dflash", config):
        return
    dflash_config = config.get("dflash_config") or {}
    if not isinstance(dflash_config, dict):
        report.mismatch("dflash_config", None, dflash_config, "dflash_config in config.json must be an object")
        return

    _check_block_size(report, spec, config, dflash_config)
    num_layers = _target_layer_count(report, config, target_num_layers)
    drafter_ids = _check_target_layer_ids(report, spec, dflash_config, num_layers)
    _check_stale_aux_ids(report, config, drafter_ids)

    mask_token_id = dflash_config.get("mask_token_id", config.get("mask_token_id"))
    if not isinstance(mask_token_id, int) or isinstance(mask_token_id, bool):
        report.mismatch("mask_token_id", spec.get("mask_token_id"), mask_token_id,
                        "config.json defines no integer dflash_config.mask_token_id: the drafter cannot mark the positions to draft")
    else:
        report.compare("mask_token_id", spec.get("mask_token_id"), mask_token_id,
                       "the drafter fills the positions to draft with the embedding of token %d; with another token it "
                       "denoises from an embedding it never saw in training: %s" % (mask_token_id, _COLLAPSE))
    _check_dflash_layout(report, spec, config, dflash_config)


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
        beyond = [layer_id for layer_id in aux_ids if isinstance(num_layers, int) and layer_id >= num_layers]
        if beyond:
            report.mismatch("eagle_aux_hidden_state_layer_ids", None, aux_ids,
                            "vLLM taps the hidden state entering layer j; the target has layers 0..%d, so %s are never "
                            "captured" % (num_layers - 1, _text(beyond)))
        else:
            report.from_drafter("eagle_aux_hidden_state_layer_ids", aux_ids, "target layers whose input vLLM taps")


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


def validate_speculative_config(requested, drafter_config=None, target_num_layers=None, allow_fields=()):
    """Validate a requested vLLM speculative config against its drafter and fill in what the drafter defines.

    ``requested``: dict as for ``--speculative-config`` plus, for dflash, DFLASH_DRAFTER_FIELDS (expectations
    checked against config.json, not passed to vLLM). ``drafter_config``: path of the drafter's config.json or its
    directory (default <model>/config.json; required for mtp without model, the target's own checkpoint).
    ``target_num_layers``: layer count of the target model, to check hidden-state taps against.

    Returns {"speculative_config" (dict for vLLM), "speculative_config_json" (compact JSON of it), "environment"
    (env vars the server needs), "filled" (fields taken from the drafter), "checks" (list of {"field", "status":
    ok|filled|from_drafter|warning|mismatch, "requested", "drafter", "detail"}), "warnings" (list of str),
    "drafter_config" (path read, None for ngram)}.
    Raises SpeculativeConfigError; for field mismatches its ``mismatches`` holds every one of them.
    """
    spec = parse_requested(requested, allow_fields)
    if target_num_layers is not None and target_num_layers < 1:
        raise SpeculativeConfigError("target_num_layers must be >= 1, got %d" % target_num_layers)
    method = spec["method"]
    report = _Report()
    path = None
    if method == "ngram":
        _check_ngram(report, spec)
    else:
        model = spec.get("model")
        if model is None and not (method == "mtp" and drafter_config):
            raise SpeculativeConfigError(
                "method %s needs model (the drafter directory)%s" % (
                    method, "; for MTP layers inside the target checkpoint give drafter_config=<target>/config.json"
                    if method == "mtp" else ""))
        path = drafter_config_path(model, drafter_config)
        config = load_drafter_config(path)
        if method == "dflash":
            _check_dflash(report, spec, config, target_num_layers)
        elif method == "mtp":
            _check_mtp(report, spec, config)
        else:
            _check_eagle(report, spec, method, config, target_num_layers)
    if report.mismatches:
        raise SpeculativeConfigError("speculative_config does not match the drafter%s:\n%s"
                                     % (" (%s)" % path if path else "", format_mismatches(report.mismatches)),
                                     report.mismatches)
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
