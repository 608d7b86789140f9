# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM 0.33 facts that the speculative-config checks rely on: fields, methods, defaults.

Every table here is read from the vllm 0.33.0 wheel, and ``make check-vllm-source``
(scripts/check_vllm_source.py) compares each one with that wheel's source:
vllm/config/speculative.py (SpeculativeConfig fields, SpeculativeMethod, MTPModelTypes,
DraftSampleMethod, the method inference of __post_init__, _verify_args),
vllm/engine/arg_utils.py (get_batch_defaults). Moving to a new vLLM release starts here.
"""

from __future__ import annotations

# The vLLM release every table below was read from (scripts/check_vllm_source.py downloads its wheel).
VLLM_VERSION = "0.33.0"
# Methods whose drafter this module checks.
SUPPORTED_METHODS = ("dflash", "eagle", "eagle3", "mtp", "ngram")

# vllm/config/speculative.py MTPModelTypes: accepted as method, rewritten to "mtp" with a deprecation warning.
MTP_METHODS = (
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

# vllm/config/speculative.py SpeculativeMethod (a Literal: any other value fails validation at start).
VLLM_METHODS = (
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
) + MTP_METHODS

# Methods of older vLLM releases that 0.33 refuses.
REMOVED_METHODS = {
    "medusa": "Medusa heads are no longer a speculative method in vLLM 0.33",
    "mlp_speculator": "MLP speculators are no longer a speculative method in vLLM 0.33",
}

# Fields of vllm/config/speculative.py SpeculativeConfig that a --speculative-config may set (the class forbids
# any other; target_model_config & co. are filled by the engine).
VLLM_FIELDS = (
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

# Field names vLLM 0.33 refuses although they look right, with the reason.
REFUSED_FIELDS = {
    "tensor_parallel_size": "vLLM keeps this field only to refuse it ('not a valid argument in the speculative_config'): "
    "the drafter's tensor parallel size is draft_tensor_parallel_size",
    "speculative_token_tree": "vLLM 0.33 has no speculative_token_tree field any more (tree drafting was removed)",
}

# What a DFlash drafter defines in its config.json: checked against the drafter, never passed to vLLM.
DFLASH_DRAFTER_FIELDS = ("target_layer_ids", "mask_token_id", "layer_types", "sliding_window", "block_size")

# vllm/config/speculative.py DraftSampleMethod: the values of draft_sample_method.
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
# vllm/config/speculative.py SpeculativeConfig.__post_init__: without a method, a marker in the drafter's name picks
# it (after "ngram" and a dotted custom-class path); no marker: draft_model (or mtp by the checkpoint's model_type).
INFERRED_BY_NAME = (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"), ("dspark", "dspark"))
# Attention kinds of DFlash drafter layers (config.json layer_types; vllm/model_executor/models/qwen3_dflash.py).
SLIDING = "sliding_attention"
FULL = "full_attention"
# vllm/envs.py: unset or 1 selects the V2 model runner (0.33's default), 0 the V1 runner.
V2_RUNNER_ENV = "VLLM_USE_V2_MODEL_RUNNER"

# vllm/engine/arg_utils.py get_batch_defaults, API server: (GPU class, max_num_batched_tokens, max_num_seqs)
BATCH_DEFAULTS = (
    ("GPUs under 70 GiB and A100", 2048, 256),
    ("H100/H200 class (70-160 GiB)", 8192, 1024),
    ("GPUs of 160 GiB and more", 16384, 1024),
)

DISABLE_LOG_STATS = "--disable-log-stats"
