# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Parsing a requested ``--speculative-config``: method, field names, value types, server arguments.

What the instance's vLLM release refuses by name or type is refused here, before any drafter is read.
The tables come from _speculative_vllm (``facts``: one release's tables).
"""

from __future__ import annotations

import difflib
import json
import os
from typing import Any, Callable, Dict, Iterable, List, Literal, Optional, Sequence, Tuple, TypedDict

from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_versions import VERSIONS
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_vllm import (
    SUPPORTED_METHODS,
    DFLASH_DRAFTER_FIELDS,
    SLIDING,
    FULL,
    VllmFacts,
    facts as vllm_facts,
    releases_with,
)

# A speculative config as the operator wrote it (module parameter, role variable) or as checked: field -> value. Its
# fields are open (every field of the release, allow_fields), its values JSON from outside.
SpecConfig = Dict[str, Any]
# A drafter's config.json, as read from disk: JSON from outside.
DrafterConfig = Dict[str, Any]
# reader(model, drafter_config) -> (path, config.json) of a drafter (read_drafter, or the role's reader).
DrafterReader = Callable[[Optional[str], Optional[str]], Tuple[str, DrafterConfig]]
# How _coerce checks and converts a field's value.
FieldKind = Literal["str", "sample_method", "positive_int", "non_negative_int", "bool", "layer_ids", "layer_types"]
# The flags of `vllm serve` that parse_server_args reads, as ServerArgs keys.
_SWITCHES: Tuple[Literal["enable_lora", "disable_log_stats"], ...] = ("enable_lora", "disable_log_stats")
_COUNTS: Tuple[Literal["max_num_batched_tokens", "max_num_seqs"], ...] = ("max_num_batched_tokens", "max_num_seqs")


class Mismatch(TypedDict):
    """A field that does not match the drafter (source "drafter") or that vLLM refuses at start (source "vllm"; then
    `drafter` holds what vLLM expects)."""

    field: str
    requested: Any
    drafter: Any
    explanation: str
    source: Literal["drafter", "vllm"]


class ServerArgs(TypedDict):
    """What the budget and metrics checks read from further `vllm serve` arguments (parse_server_args)."""

    max_num_batched_tokens: Optional[int]
    max_num_seqs: Optional[int]
    enable_lora: bool
    disable_log_stats: bool


_FIELD_KINDS: Dict[str, FieldKind] = {
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

    def __init__(self, message: str, mismatches: Optional[Iterable[Mismatch]] = None) -> None:
        super().__init__(message)
        self.mismatches: List[Mismatch] = list(mismatches or [])


def accepted_fields(method: Optional[str], facts: VllmFacts) -> Tuple[str, ...]:
    """Fields of ``speculative_config`` accepted for ``method``: the release's fields plus, for dflash,
    DFLASH_DRAFTER_FIELDS."""
    return facts.fields + (DFLASH_DRAFTER_FIELDS if method == "dflash" else ())


def _coerce(kind: FieldKind, value: object, facts: VllmFacts) -> object:
    """Return ``value`` converted to ``kind``; raise ValueError saying what was expected."""
    if kind == "str":
        if not isinstance(value, str) or not value:
            raise ValueError("expected a non-empty string")
        return value
    if kind == "sample_method":
        if value not in facts.draft_sample_methods:
            raise ValueError("vLLM accepts %s" % " or ".join(facts.draft_sample_methods))
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
        return [_coerce("non_negative_int", item, facts) for item in value]
    # layer_types: one type for every drafter layer, or a list with one type per layer
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not items or any(item not in (SLIDING, FULL) for item in items):
        raise ValueError("expected %s or %s, or a list of them (one per drafter layer)" % (SLIDING, FULL))
    return value if isinstance(value, str) else list(items)


def _method_problem(method: Any, facts: VllmFacts) -> Tuple[Optional[str], Optional[str]]:
    """(why the release refuses ``method`` at start, or None; a warning for a custom method it may run, or None)."""
    if method in facts.methods:
        return None, None
    close = difflib.get_close_matches(str(method), facts.methods, 1, 0.8)
    if (
        facts.custom_methods
        and isinstance(method, str)
        and method
        and method not in facts.removed_methods
        and not close
    ):
        return None, (
            "%r is no built-in method of vLLM %s: vLLM runs it only when a vLLM plugin on the host registers it "
            "(register_speculative_method; vLLM then sets custom_method to it), and fails at start otherwise "
            "('Unsupported speculative method'): this module cannot see the host's plugins and checks no drafter "
            "for it" % (method, facts.version)
        )
    reason = facts.removed_methods.get(method, "")
    custom = [version for version in VERSIONS if vllm_facts(version).custom_methods]
    if not reason and close:
        reason = "did you mean %s?" % close[0]
    elif not reason and releases_with("methods", method):
        reason = "a method of vLLM %s only" % ", ".join(releases_with("methods", method))
    elif not reason and isinstance(method, str) and method.endswith("_mtp"):
        reason = "vLLM %s knows only its own list of per-model MTP names (rewritten to mtp); use method mtp" % (
            facts.version
        )
    elif not reason and custom and not facts.custom_methods:
        reason = "vLLM %s runs a method a vLLM plugin registers; vLLM %s runs only its built-in ones" % (
            ", ".join(custom),
            facts.version,
        )
    return (
        "speculative_config.method %r is not a method of vLLM %s%s: its method field accepts only %s and the "
        "per-model *_mtp names%s, and any other value fails validation when the server starts"
        % (
            method,
            facts.version,
            " (%s)" % reason if reason else "",
            ", ".join(facts.builtin_methods),
            " (or a method a vLLM plugin registers)" if facts.custom_methods else "",
        )
    ), None


def infer_method(model: object, facts: VllmFacts) -> str:
    """The method a release picks when ``method`` is not given, by name only (``facts.inferred_at`` in its wheel).

    ``model`` "ngram" -> ngram; before 0.34 a dotted import path -> custom_class; a drafter path containing
    "eagle-" -> eagle, "eagle3" -> eagle3, "dflash" -> dflash, "dspark" -> dspark; else draft_model (vLLM then still
    switches to mtp when the checkpoint's model_type is an MTP type: see resolve_method).
    """
    if model in ("ngram", "[ngram]"):
        return "ngram"
    if (
        "custom_class" in facts.methods
        and isinstance(model, str)
        and "/" not in model
        and not model.startswith(("http://", "https://", "file://"))
    ):
        parts = model.split(".")
        if len(parts) >= 2 and all(part.isidentifier() for part in parts):
            return "custom_class"
    name = str(model or "").lower()
    for marker, method in facts.inferred_by_name:
        if marker in name:
            return method
    return "draft_model"


def parse_requested(
    requested: object,
    allow_fields: Sequence[str] = (),
    notes: Optional[List[str]] = None,
    facts: Optional[VllmFacts] = None,
) -> SpecConfig:
    """Check the method, the field names and the value types of a requested speculative config, as the release of
    ``facts`` (default: the newest known) does.

    Keys are spelled with ``_`` (vLLM turns ``-`` into ``_``). ``allow_fields``: extra field names passed to vLLM
    unchecked (fields of newer vLLM releases). ``notes``: a list that receives warnings (per-model MTP method
    rewritten, fields vLLM ignores for the method or altogether, a custom method). Returns a new dict with values
    converted (integers given as strings become int; a per-model MTP method becomes mtp). Raises
    SpeculativeConfigError listing every problem.
    """
    facts = facts or vllm_facts()
    notes = [] if notes is None else notes
    if not isinstance(requested, dict):
        raise SpeculativeConfigError("speculative_config must be a dictionary, got %s" % type(requested).__name__)
    requested = dict((str(name).replace("-", "_"), value) for name, value in requested.items())
    method = _requested_method(requested, notes, facts)
    _refuse_fields(requested, method, allow_fields, facts)
    parsed: SpecConfig = {}
    problems: List[str] = []
    for name, value in requested.items():
        kind = _FIELD_KINDS.get(name)
        if kind is None:  # a vLLM field this module does not check, or an allow_fields entry: vLLM validates it
            parsed[name] = value
            continue
        try:
            parsed[name] = _coerce(kind, value, facts)
        except ValueError as error:
            problems.append("%s: %s, got %r" % (name, error, value))
    if problems:
        raise SpeculativeConfigError("speculative_config has invalid values: %s" % "; ".join(problems))
    notes.extend("%s: %s" % (name, facts.no_effect_fields[name]) for name in parsed if name in facts.no_effect_fields)
    if method in ("ngram", "ngram_gpu") and "model" in parsed:
        notes.append(
            "model: %s drafts from the prompt's own tokens; vLLM %s ignores model=%s for it"
            % (method, facts.version, parsed["model"])
        )
    if method not in (None, "ngram", "ngram_gpu") and any(
        name in parsed for name in ("prompt_lookup_min", "prompt_lookup_max")
    ):
        notes.append(
            "prompt_lookup_min/prompt_lookup_max: only the ngram methods use them; vLLM %s sets them to 0 "
            "for method %s" % (facts.version, method)
        )
    return parsed


def _requested_method(requested: SpecConfig, notes: List[str], facts: VllmFacts) -> Optional[str]:
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
    problem, warning = _method_problem(method, facts)
    if problem:
        raise SpeculativeConfigError(problem)
    if warning:
        notes.append("method: %s" % warning)
    if method in facts.mtp_methods and method != "mtp":
        notes.append(
            "method: vLLM %s accepts %r but logs 'method `%s` is deprecated and replaced with mtp' and "
            "runs it as mtp; passed to vLLM as mtp" % (facts.version, method, method)
        )
        requested["method"] = method = "mtp"
    return method


def _field_refusal(name: str, facts: VllmFacts) -> str:
    """Why the release of `facts` refuses field `name` of a speculative config."""
    if name in facts.refused_fields:
        return facts.refused_fields[name]
    if name in DFLASH_DRAFTER_FIELDS:
        return (
            "not a vLLM field: this module accepts it only with method dflash, as a value checked against "
            "the drafter's config.json"
        )
    elsewhere = releases_with("fields", name)
    return "%s vLLM %s's SpeculativeConfig, whose config classes forbid unknown fields: the server fails at start" % (
        "a field of vLLM %s, not of" % ", ".join(elsewhere) if elsewhere else "not a field of",
        facts.version,
    )


def _refuse_fields(requested: SpecConfig, method: Optional[str], allow_fields: Sequence[str], facts: VllmFacts) -> None:
    """Raise SpeculativeConfigError naming every field of `requested` that vLLM (or this module) refuses for `method`."""
    accepted = accepted_fields(method, facts)
    refused = [
        "%s=%s: %s" % (name, value_text(value), _field_refusal(name, facts))
        for name, value in requested.items()
        if name not in accepted and name not in allow_fields
    ]
    if refused:
        raise SpeculativeConfigError(
            "speculative_config field(s) refused: %s. Fields vLLM %s accepts: %s%s"
            % (
                "; ".join(refused),
                facts.version,
                ", ".join(facts.fields),
                " (and, checked against config.json for dflash: %s)" % ", ".join(DFLASH_DRAFTER_FIELDS)
                if method == "dflash"
                else "",
            )
        )


def drafter_config_path(model: Optional[str], drafter_config: Optional[str] = None) -> str:
    """Path of the drafter's config.json: ``drafter_config`` (a file, or a directory holding config.json) or <model>/config.json."""
    if not drafter_config:
        if not isinstance(model, str) or not model:
            # vllm_speculative_config never asks so (_check_drafter); vllm_server_host reads what it is given
            raise SpeculativeConfigError(
                "no drafter config.json to read: neither a drafter model (a directory) nor drafter_config is given"
            )
        return os.path.join(model, "config.json")
    return os.path.join(drafter_config, "config.json") if os.path.isdir(drafter_config) else drafter_config


def load_drafter_config(path: str) -> DrafterConfig:
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


def read_drafter(model: Optional[str], drafter_config: Optional[str] = None) -> Tuple[str, DrafterConfig]:
    """(path, config dict) of the drafter's config.json on this host. Raises SpeculativeConfigError."""
    path = drafter_config_path(model, drafter_config)
    return path, load_drafter_config(path)


def value_text(value: object) -> str:
    """Compact rendering of a value for messages."""
    if value is None:
        return "not set"
    if isinstance(value, (list, dict, bool)):
        return json.dumps(value, separators=(", ", ": "))
    return str(value)


def parse_server_args(args: Optional[Iterable[object]]) -> ServerArgs:
    """What the budget and metrics checks need from further ``vllm serve`` arguments (a list of str).

    Returns {"max_num_batched_tokens": int or None, "max_num_seqs": int or None, "enable_lora": bool,
    "disable_log_stats": bool}. ``--flag value``, ``--flag=value`` and ``--flag_name`` spellings are read as vLLM's
    parser reads them; a value that is not an integer raises SpeculativeConfigError.
    """
    found: ServerArgs = {
        "max_num_batched_tokens": None,
        "max_num_seqs": None,
        "enable_lora": False,
        "disable_log_stats": False,
    }
    words = [str(arg) for arg in (args or [])]
    for index, arg in enumerate(words):
        if not arg.startswith("--"):
            continue
        name, sep, value = arg[2:].partition("=")
        name = name.replace("-", "_")
        if name in _SWITCHES:
            found[name] = True
        elif name in _COUNTS:
            if not sep:
                value = words[index + 1] if index + 1 < len(words) else ""
            try:
                found[name] = int(value)
            except ValueError:
                raise SpeculativeConfigError(
                    "--%s %s: vLLM expects an integer there and fails at start otherwise"
                    % (name.replace("_", "-"), value or "(no value)")
                ) from None
    return found
