# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Parsing a requested ``--speculative-config``: method, field names, value types, server arguments.

What vLLM 0.33 refuses by name or type is refused here, before any drafter is read.
The tables come from _speculative_vllm.
"""

from __future__ import annotations

import json
import os

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpuops.nvidia.plugins.module_utils._speculative_vllm import (
    DRAFT_SAMPLE_METHODS,
    INFERRED_BY_NAME,
    VLLM_VERSION,
    SUPPORTED_METHODS,
    MTP_METHODS,
    VLLM_METHODS,
    REMOVED_METHODS,
    VLLM_FIELDS,
    REFUSED_FIELDS,
    DFLASH_DRAFTER_FIELDS,
    SLIDING,
    FULL,
)


_FIELD_KINDS = {
    "method": "str",
    "model": "str",
    "quantization": "str",
    "revision": "str",
    "code_revision": "str",
    "attention_backend": "str",
    "draft_sample_method": "sample_method",
    "num_speculative_tokens": "positive_int",
    "draft_tensor_parallel_size": "positive_int",
    "max_model_len": "positive_int",
    "prompt_lookup_min": "positive_int",
    "prompt_lookup_max": "positive_int",
    "block_size": "positive_int",
    "sliding_window": "positive_int",
    "mask_token_id": "non_negative_int",
    "enforce_eager": "bool",
    "disable_padded_drafter_batch": "bool",
    "parallel_drafting": "bool",
    "target_layer_ids": "layer_ids",
    "layer_types": "layer_types",
}


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
        if value not in DRAFT_SAMPLE_METHODS:
            raise ValueError("vLLM accepts %s" % " or ".join(DRAFT_SAMPLE_METHODS))
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
    return (
        "speculative_config.method %r is not a method of vLLM %s%s: its method field accepts only %s and the "
        "per-model *_mtp names, and any other value fails validation when the server starts"
        % (method, VLLM_VERSION, " (%s)" % reason if reason else "", ", ".join(VLLM_METHODS[:11]))
    )


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
    for marker, method in INFERRED_BY_NAME:
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
        notes.append(
            "model: %s drafts from the prompt's own tokens; vLLM %s ignores model=%s for it"
            % (method, VLLM_VERSION, parsed["model"])
        )
    if method not in (None, "ngram", "ngram_gpu") and any(
        name in parsed for name in ("prompt_lookup_min", "prompt_lookup_max")
    ):
        notes.append(
            "prompt_lookup_min/prompt_lookup_max: only the ngram methods use them; vLLM %s sets them to 0 "
            "for method %s" % (VLLM_VERSION, method)
        )
    return parsed


def _requested_method(requested, notes):
    """The method of `requested` (None: vLLM infers it from the drafter model), a per-model MTP method rewritten to
    mtp in `requested` with a note. Raises SpeculativeConfigError for an unknown method, or neither method nor model."""
    method = requested.get("method")
    if method is None:
        if requested.get("model") is None:
            raise SpeculativeConfigError(
                "speculative_config has neither method nor model: vLLM needs a method (%s) or a drafter model to "
                "infer it from" % ", ".join(SUPPORTED_METHODS)
            )
        return None
    problem = _method_problem(method)
    if problem:
        raise SpeculativeConfigError(problem)
    if method in MTP_METHODS and method != "mtp":
        notes.append(
            "method: vLLM %s accepts %r but logs 'method `%s` is deprecated and replaced with mtp' and "
            "runs it as mtp; passed to vLLM as mtp" % (VLLM_VERSION, method, method)
        )
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
            reason = (
                "not a vLLM field: this module accepts it only with method dflash, as a value checked against "
                "the drafter's config.json"
            )
        else:
            reason = (
                "not a field of vLLM %s's SpeculativeConfig, whose config classes forbid unknown fields: the "
                "server fails at start" % VLLM_VERSION
            )
        refused.append("%s=%s: %s" % (name, _text(value), reason))
    if refused:
        raise SpeculativeConfigError(
            "speculative_config field(s) refused: %s. Fields vLLM %s accepts: %s%s"
            % (
                "; ".join(refused),
                VLLM_VERSION,
                ", ".join(VLLM_FIELDS),
                " (and, checked against config.json for dflash: %s)" % ", ".join(DFLASH_DRAFTER_FIELDS)
                if method == "dflash"
                else "",
            )
        )


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
            "Hugging Face id, this module does not), or point drafter_config at the drafter's config.json" % path
        )
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


def read_drafter(model, drafter_config=None):
    """(path, config dict) of the drafter's config.json on this host. Raises SpeculativeConfigError."""
    path = drafter_config_path(model, drafter_config)
    return path, load_drafter_config(path)


def _text(value):
    """Compact rendering of a value for messages."""
    if value is None:
        return "not set"
    if isinstance(value, (list, dict, bool)):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


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
                raise SpeculativeConfigError(
                    "--%s %s: vLLM expects an integer there and fails at start otherwise"
                    % (name.replace("_", "-"), value or "(no value)")
                ) from None
    return found
