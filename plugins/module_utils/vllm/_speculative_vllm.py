# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM facts that the speculative-config checks rely on, per vLLM release: fields, methods, defaults.

One table per fact, keyed by release: the vLLM 0.33.0 tables (_BASE) and what 0.32.0 and 0.34.0 change in them
(_CHANGES). ``facts(version)`` gives one release's tables. ``make check-vllm-source``
(scripts/check_vllm_source.py) compares each release's tables with that release's wheel:
vllm/config/speculative.py (SpeculativeConfig fields, SpeculativeMethod, MTPModelTypes, DraftSampleMethod,
_verify_args, the method inference), vllm/v1/worker/gpu/spec_decode/speculator_config.py (0.34's method
inference), vllm/engine/arg_utils.py (get_batch_defaults), vllm/envs.py (the V1 model runner's variable).
Adding a vLLM release: CONTRIBUTING.md, "Adding a vLLM release" (its differences go to _CHANGES).
"""

from __future__ import annotations

from typing import Any, Dict, List, Literal, NamedTuple, Optional, Tuple, TypedDict, cast

# The releases whose wheels every table below was read from, oldest first (scripts/check_vllm_source.py).
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_versions import VERSIONS, Release

NEWEST = VERSIONS[-1]
# A method whose drafter this module checks.
SupportedMethod = Literal["dflash", "eagle", "eagle3", "mtp", "ngram"]
# Methods whose drafter this module checks.
SUPPORTED_METHODS: Tuple[SupportedMethod, ...] = ("dflash", "eagle", "eagle3", "mtp", "ngram")
# How a release counts the token slots a request takes from max_num_batched_tokens (_speculative_checks._lookahead).
BudgetRule = Literal["num_lookahead_tokens", "max_num_new_slots_for_drafting"]
# A GPU class's defaults of the API server: (GPU class, max_num_batched_tokens, max_num_seqs).
BatchDefault = Tuple[str, int, int]


class TupleChange(TypedDict, total=False):
    """What a release adds to and removes from a tuple table of _BASE."""

    add: Tuple[str, ...]
    remove: Tuple[str, ...]


class DictChange(TypedDict, total=False):
    """What a release adds to a dict table of _BASE (name: reason) and which names it removes."""

    add: Dict[str, str]
    remove: Tuple[str, ...]


# What a release changes in _BASE, by table (a field of VllmFacts): a TupleChange or a DictChange, or its own value.
FactChanges = Dict[str, object]


# vllm/config/speculative.py MTPModelTypes (0.33.0): accepted as method, rewritten to "mtp" with a deprecation warning.
_MTP_METHODS = (
    "deepseek_mtp",
    "dots3_note_mtp",
    "mimo_mtp",
    "mimo_v2_mtp",
    "glm4_moe_mtp",
    "glm4_moe_lite_mtp",
    "glm_ocr_mtp",
    "ernie_mtp",
    "nemotron_h_mtp",
    "exaone_moe_mtp",
    "exaone4_5_mtp",
    "qwen3_next_mtp",
    "qwen4_exp_mtp",
    "qwen3_5_mtp",
    "longcat_flash_mtp",
    "bailing_hybrid_v3_mtp",
    "minimax_m3_mtp",
    "bailing_hybrid_mtp",
    "kimi_k3_mtp",
    "pangu_ultra_moe_mtp",
    "step3p5_mtp",
    "step5_mtp",
    "hy_v3_mtp",
    "hy_v4_mtp",
    "gemma4_mtp",
    "inkling_mtp",
    "glm5_next_mtp",
)

# vllm/config/speculative.py SpeculativeMethod (0.33.0), less the MTP names: a Literal, any other value fails at start.
_METHODS = (
    "ngram",
    "draft_model",
    "suffix",
    "custom_class",
    "eagle",
    "eagle3",
    "extract_hidden_states",
    "mtp",
    "dflash",
    "ngram_gpu",
    "dspark",
)

# Methods of older vLLM releases that 0.33.0 refuses, with the reason.
_REMOVED_METHODS: Dict[str, str] = {
    "medusa": "Medusa heads are no longer a speculative method (removed in vLLM 0.33)",
    "mlp_speculator": "MLP speculators are no longer a speculative method (removed in vLLM 0.33)",
}

# Fields of vllm/config/speculative.py SpeculativeConfig (0.33.0) that a --speculative-config may set (the class
# forbids any other; target_model_config & co. are filled by the engine).
_FIELDS = (
    "method",
    "model",
    "num_speculative_tokens",
    "enforce_eager",
    "draft_tensor_parallel_size",
    "quantization",
    "moe_backend",
    "attention_backend",
    "kv_cache_dtype",
    "max_model_len",
    "revision",
    "code_revision",
    "index_share_for_mtp_iteration",
    "disable_padded_drafter_batch",
    "disable_eagle_block_drop",
    "disable_lookahead_block_hashes",
    "draft_lm_head_quantization",
    "use_local_argmax_reduction",
    "use_heterogeneous_vocab",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "parallel_drafting",
    "num_speculative_tokens_per_batch_size",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
    "draft_load_config",
    "rejection_sample_method",
    "synthetic_acceptance_rates",
    "synthetic_acceptance_length",
    "enable_adaptive_verification",
    "draft_sample_method",
    "dspark_draft_topk",
    "xpress_topc",
    "fly_window_size",
    "fly_entropy_threshold",
    "fly_entropy_top_k",
)

# Field names vLLM 0.33.0 refuses although they look right, with the reason.
_REFUSED_FIELDS: Dict[str, str] = {
    "tensor_parallel_size": "vLLM keeps this field only to refuse it ('not a valid argument in the speculative_config'): "
    "the drafter's tensor parallel size is draft_tensor_parallel_size",
    "speculative_token_tree": "vLLM has no speculative_token_tree field any more (tree drafting was removed)",
}

# What a DFlash drafter defines in its config.json: checked against the drafter, never passed to vLLM.
DFLASH_DRAFTER_FIELDS: Tuple[str, ...] = (
    "target_layer_ids",
    "mask_token_id",
    "layer_types",
    "sliding_window",
    "block_size",
)
# Attention kinds of DFlash drafter layers (config.json layer_types; vllm/model_executor/models/qwen3_dflash.py).
SLIDING = "sliding_attention"
FULL = "full_attention"
# vllm/envs.py (0.32, 0.33): unset or 1 selects the V2 model runner (the default), 0 the V1 runner. 0.34 has no V1
# runner and does not read the variable.
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"
DISABLE_LOG_STATS = "--disable-log-stats"


class VllmFacts(NamedTuple):
    """One release's tables and its version ("0.34.0"): _BASE for 0.33.0 (comments there), with _CHANGES applied."""

    version: Release
    fields: Tuple[str, ...]
    refused_fields: Dict[str, str]
    mtp_methods: Tuple[str, ...]
    builtin_methods: Tuple[str, ...]
    removed_methods: Dict[str, str]
    custom_methods: bool
    draft_sample_methods: Tuple[str, ...]
    inferred_by_name: Tuple[Tuple[str, str], ...]
    inferred_at: str
    batch_defaults: Tuple[BatchDefault, ...]
    budget_rule: BudgetRule
    dflash_active_seqs: bool
    v1_runner: bool
    no_effect_fields: Dict[str, str]

    @property
    def methods(self) -> Tuple[str, ...]:
        """vLLM's SpeculativeMethod Literal: the built-in methods and the per-model MTP names."""
        return self.builtin_methods + self.mtp_methods


_BASE = VllmFacts(
    version="0.33.0",
    fields=_FIELDS,
    refused_fields=_REFUSED_FIELDS,
    mtp_methods=_MTP_METHODS,
    # SpeculativeMethod with the MTP names (vLLM's Literal), "methods" below.
    builtin_methods=_METHODS,
    removed_methods=_REMOVED_METHODS,
    # SpeculativeConfig.method accepts, besides the built-in methods, a name a vLLM plugin registered
    # (vllm/v1/worker/gpu/spec_decode/speculator_config.py register_speculative_method): 0.34 on.
    custom_methods=False,
    # DraftSampleMethod: the values of draft_sample_method.
    draft_sample_methods=("greedy", "probabilistic"),
    # Without a method, a marker in the drafter's name picks it (after "ngram" and, before 0.34, a dotted
    # custom-class path); no marker: draft_model (or mtp by the checkpoint's model_type).
    inferred_by_name=(("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"), ("dspark", "dspark")),
    inferred_at="vllm/config/speculative.py SpeculativeConfig.__post_init__",
    # vllm/engine/arg_utils.py get_batch_defaults, API server: (GPU class, max_num_batched_tokens, max_num_seqs)
    batch_defaults=(
        ("GPUs under 70 GiB and A100", 2048, 256),
        ("H100/H200 class (70-160 GiB)", 8192, 1024),
        ("GPUs of 160 GiB and more", 16384, 1024),
    ),
    # vllm/config/vllm.py _set_max_num_scheduled_tokens: what max_num_batched_tokens must exceed per request
    # (_speculative_checks._lookahead), and whether a DFlash budget lowers max_num_active_seqs.
    budget_rule="num_lookahead_tokens",
    dflash_active_seqs=True,
    # vllm/envs.py has VLLM_USE_V2_MODEL_RUNNER: a V1 model runner exists and the variable selects it.
    v1_runner=True,
    # Fields whose documentation says "Deprecated and has no effect" (vLLM accepts and ignores them).
    no_effect_fields={},
)

# What each release changes in _BASE: {"add": ..., "remove": ...} for a tuple or a dict, or the release's value.
_CHANGES: Dict[Release, FactChanges] = {
    "0.32.0": {
        "fields": {
            "remove": (
                "disable_lookahead_block_hashes",
                "draft_lm_head_quantization",
                "xpress_topc",
                "fly_window_size",
                "fly_entropy_threshold",
                "fly_entropy_top_k",
            )
        },
        "mtp_methods": {"remove": ("step5_mtp",)},
        "builtin_methods": {"add": ("medusa", "mlp_speculator")},
        "removed_methods": {"remove": ("medusa", "mlp_speculator")},
        "budget_rule": "max_num_new_slots_for_drafting",
        "dflash_active_seqs": False,
    },
    "0.34.0": {
        "fields": {
            "remove": ("disable_padded_drafter_batch", "use_heterogeneous_vocab"),
            "add": ("draft_decode_context_parallel_size", "suffix_decoding_corpus_tokens", "speculator_options"),
        },
        "refused_fields": {
            "add": {
                "custom_method": "vLLM 0.34 sets custom_method itself (a field it does not take as input): name the "
                "method a plugin registered in method, and vLLM moves it to custom_method"
            }
        },
        "mtp_methods": {"add": ("nemotron3_5_transcribe_mtp",)},
        "builtin_methods": {"remove": ("custom_class",)},
        "removed_methods": {
            "add": {
                "custom_class": "custom_class was removed in vLLM 0.34: a custom proposer is a method of its own, "
                "registered by a vLLM plugin (register_speculative_method) and named in method"
            }
        },
        "custom_methods": True,
        "inferred_at": "vllm/v1/worker/gpu/spec_decode/speculator_config.py _CHECKPOINT_DETECTION_ORDER, the "
        "matches() of SpeculatorConfig in eagle/, dflash/, dspark/config.py",
        "v1_runner": False,
        "no_effect_fields": {
            "add": {
                "parallel_drafting": "deprecated in vLLM 0.34 and has no effect: DFlash and DSpark always draft in "
                "parallel, and no other method supports it",
                "suffix_decoding_max_spec_factor": "deprecated in vLLM 0.34 and has no effect: the GPU suffix "
                "speculator always drafts num_speculative_tokens tokens",
                "suffix_decoding_min_token_prob": "deprecated in vLLM 0.34 and has no effect: the GPU suffix "
                "speculator always drafts num_speculative_tokens tokens",
            }
        },
    },
}


def _changed(value: object, change: object) -> object:
    """`value` (a table of _BASE) with `change` (of _CHANGES) applied: {"add", "remove"} on a tuple or a dict, else
    `change` itself."""
    if not (isinstance(change, dict) and change and set(change) <= {"add", "remove"}):
        return change
    remove, add = change.get("remove", ()), change.get("add", ())
    if isinstance(value, dict):
        kept = dict((key, item) for key, item in value.items() if key not in remove)
        kept.update(add)
        return kept
    return tuple(item for item in cast(Tuple[str, ...], value) if item not in remove) + tuple(add)


_FACTS: Dict[Release, VllmFacts] = {}


def facts(version: Optional[str] = None) -> VllmFacts:
    """The tables of a release of VERSIONS (default: the newest). Raises KeyError for another version."""
    version = version or NEWEST
    if version not in VERSIONS:
        raise KeyError("no vLLM facts for %s (known: %s)" % (version, ", ".join(VERSIONS)))
    if version not in _FACTS:
        changes = _CHANGES.get(version, {})
        tables: Dict[str, Any] = {
            key: _changed(value, changes[key]) if key in changes else value for key, value in _BASE._asdict().items()
        }
        tables["version"] = version
        _FACTS[version] = VllmFacts(**tables)
    return _FACTS[version]


def batch_class(name: Optional[str], total_mib: Optional[int]) -> Optional[str]:
    """The GPU class of batch_defaults whose defaults vLLM takes on a GPU named `name` with `total_mib` MiB (NVML's),
    or None where that cannot be told. vllm/engine/arg_utils.py get_batch_defaults reads CUDA device 0 (the first
    GPU the server sees): 160 GiB or more; 70 GiB or more unless the name holds "a100" (from 0.33 also unless the
    compute capability is 12.1, GB10); else the small class. NVML reports no memory for GB10, and its capability is not
    read here: None for it."""
    if not name or total_mib is None or "gb10" in name.lower():
        return None
    labels = [row[0] for row in _BASE.batch_defaults]
    if total_mib >= 160 * 1024:
        return labels[2]
    if total_mib >= 70 * 1024 and "a100" not in name.lower():
        return labels[1]
    return labels[0]


def releases_with(attribute: str, name: object) -> List[Release]:
    """The releases of VERSIONS whose `attribute` table holds `name` (to say where a refused name is valid)."""
    return [version for version in VERSIONS if name in getattr(facts(version), attribute)]
