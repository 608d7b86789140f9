"""Speculative decoding as the simulated vLLM models it: start-up checks and draft acceptance.

This models vLLM's behaviour; it deliberately shares nothing with the collection's validator.
The default is vLLM 0.33.0 (sources: the vllm-0.33.0 wheel, paths below); SIMVLLM_VERSION below 0.33
(for example "0.26") restores the older behaviours listed under LEGACY.

Start-up errors (SpeculativeConfigError, the server exits 1), vLLM 0.33:
- a key that is not a SpeculativeConfig field (vllm/config/utils.py: extra="forbid"; `-` read as `_`,
  vllm/engine/arg_utils.py create_speculative_config), `tensor_parallel_size` (refused by
  _verify_args), `speculative_token_tree` (no such field any more);
- a method outside vLLM's Literal (medusa and mlp_speculator are gone); per-model `*_mtp` names are
  accepted and run as mtp (vllm/config/speculative.py __post_init__);
- no num_speculative_tokens (no n_predict in the drafter config), a missing drafter directory;
- DFlash: sliding layers without a window (qwen3_dflash.py _resolve_layer_attention); a mixed
  sliding/full drafter on the V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0; vllm/config/vllm.py
  _validate_v1_model_runner); max_num_batched_tokens <= num_speculative_tokens + 1
  (vllm/config/vllm.py _set_max_num_scheduled_tokens).
vLLM 0.33 does not compare DFlash num_speculative_tokens with block_size.

Silent mismatch (the server starts, acceptance collapses to ~1 %), DFlash only: what vLLM reads from
the drafter's config.json disagrees with what the drafter was trained on. The training truth is the
drafter directory's `trained.json` when present (the simulated weights), else config.json itself:
- tapped target layers, looked up as vLLM 0.33 does (V2 runner, eagle3_utils.py
  get_eagle3_aux_layers_from_config): top-level eagle_aux_hidden_state_layer_ids, then
  dflash_config.target_layer_ids + 1, dspark_target_layer_ids + 1, top-level target_layer_ids + 1,
  dflash_config/eagle_config layer_ids; V1 runner (gpu_model_runner.py): the first two, then an
  eagle_config dict's eagle_aux_hidden_state_layer_ids replaces them;
- mask token: (eagle_config | dflash_config).mask_token_id, else top-level mask_token_id;
- attention layout and causality (qwen3_dflash.py): layer_types, dflash_config.use_swa, top-level
  is_causal, then dflash_config.causal.

LEGACY (SIMVLLM_VERSION < 0.33): unknown keys are ignored except the drafter keys target_layer_ids,
mask_token_id, layer_types and use_swa, which override config.json (a test device standing for a
hand-edited drafter, no vLLM source); medusa and mlp_speculator are methods; DFlash
num_speculative_tokens > block_size - 1 fails; the V1 runner is the default and runs a mixed
sliding/full drafter as all full attention (no error).
Other methods agree with their drafter by construction.
"""

import hashlib
import json
import os
from dataclasses import dataclass

VLLM_VERSION = "0.33.0"
MTP_METHODS = {
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
    "mtp",
    "kimi_k3_mtp",
    "pangu_ultra_moe_mtp",
    "step3p5_mtp",
    "step5_mtp",
    "hy_v3_mtp",
    "hy_v4_mtp",
    "gemma4_mtp",
    "inkling_mtp",
    "glm5_next_mtp",
}
METHODS_WITH_DRAFTER = {"draft_model", "eagle", "eagle3", "dflash", "dspark"}
METHODS_WITHOUT_DRAFTER = {"ngram", "suffix", "ngram_gpu", "custom_class", "extract_hidden_states"}
LEGACY_METHODS = {"medusa", "mlp_speculator"}
FIELDS = {
    "enforce_eager",
    "num_speculative_tokens",
    "model",
    "method",
    "draft_tensor_parallel_size",
    "tensor_parallel_size",
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
}
LEGACY_DRAFTER_KEYS = ("target_layer_ids", "mask_token_id", "layer_types", "use_swa")
AGREEING_ACCEPTANCE = (0.6, 0.8)
DISAGREEING_ACCEPTANCE = 0.01
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


class SpeculativeConfigError(ValueError):
    """The speculative config makes vLLM fail at start-up."""


def version_tuple(text):
    """(major, minor) of a version string such as "0.33.0"; (0, 33) for an unparsable one."""
    try:
        parts = [int(part) for part in str(text).split(".")[:2]]
        return (parts + [0])[0], (parts + [0, 0])[1]
    except ValueError:
        return 0, 33


def is_legacy(environ):
    """Whether SIMVLLM_VERSION asks for vLLM before 0.33."""
    return version_tuple(environ.get("SIMVLLM_VERSION", VLLM_VERSION)) < (0, 33)


def v2_runner(environ):
    """Whether vLLM runs its V2 model runner: VLLM_USE_V2_MODEL_RUNNER read as bool(int(value)) (vllm/envs.py);
    unset: V2 in 0.33 (vllm/config/vllm.py use_v2_model_runner), V1 before. Raises for a value that is no integer."""
    value = environ.get("VLLM_USE_V2_MODEL_RUNNER")
    if value is None:
        return not is_legacy(environ)
    try:
        return bool(int(value))
    except ValueError:
        raise SpeculativeConfigError("invalid literal for int() with base 10: %r" % value) from None


def _load_json(path, missing_message):
    try:
        with open(path) as config_file:
            return json.load(config_file)
    except OSError:
        raise SpeculativeConfigError(missing_message) from None
    except ValueError as error:
        raise SpeculativeConfigError("Invalid JSON in %s: %s" % (path, error)) from None


def _load_drafter_config(model):
    """config.json of the drafter directory `model` as a dict."""
    return _load_json(
        os.path.join(model, "config.json"),
        "Invalid repository ID or local directory specified: '%s'. Please verify the model "
        "path or repository ID." % model,
    )


def _speculators_to_vllm(config):
    """vllm/transformers_utils/configs/speculators/algos.py update_dflash, for speculators-format drafters."""
    if str(config.get("speculators_model_type", "")).lower() not in ("dflash", "dflash2"):
        return config
    converted = dict(config.get("transformer_layer_config") or {})
    aux = config.get("aux_hidden_state_layer_ids") or []
    converted["eagle_aux_hidden_state_layer_ids"] = aux
    converted["dflash_config"] = {
        "mask_token_id": config.get("mask_token_id"),
        "target_layer_ids": [i - 1 for i in aux],
        "causal": not config.get("sliding_window_non_causal", True),
    }
    return converted


def _ids(value):
    return list(value) if isinstance(value, (list, tuple)) and value else None


def dflash_taps(config, v2):
    """Hidden states vLLM 0.33 taps for a DFlash drafter config (None: the target's default layers)."""
    dflash = config.get("dflash_config") or {}
    taps = _ids(config.get("eagle_aux_hidden_state_layer_ids"))
    if not taps and _ids(dflash.get("target_layer_ids")):
        taps = [i + 1 for i in dflash["target_layer_ids"]]
    eagle_config = config.get("eagle_config")
    if not v2:
        if isinstance(eagle_config, dict) and eagle_config:
            taps = _ids(eagle_config.get("eagle_aux_hidden_state_layer_ids"))
        return taps
    for key in ("dspark_target_layer_ids", "target_layer_ids"):
        if not taps and _ids(config.get(key)):
            taps = [i + 1 for i in config[key]]
    for section in (dflash, eagle_config if isinstance(eagle_config, dict) else {}):
        if not taps and _ids(section.get("layer_ids")):
            taps = list(section["layer_ids"])
    return taps


def dflash_mask_token(config):
    merged = dict(config.get("eagle_config") or {}, **(config.get("dflash_config") or {}))
    return merged.get("mask_token_id", config.get("mask_token_id"))


def dflash_layout(config, v2, legacy=False):
    """[(sliding, causal)] per drafter layer as vLLM builds them (qwen3_dflash.py). Raises SpeculativeConfigError."""
    dflash = config.get("dflash_config") or {}
    layer_types = config.get("layer_types")
    count = len(layer_types) if layer_types else config.get("num_hidden_layers", 1)
    use_swa = bool(dflash.get("use_swa", False))
    if layer_types is not None:
        num_sliding = sum(layer == SLIDING_ATTENTION for layer in layer_types)
        if 0 < num_sliding < len(layer_types) and not v2:
            if legacy:
                layer_types = [FULL_ATTENTION] * len(layer_types)
            else:
                raise SpeculativeConfigError("Model Runner V1 does not support: mixed sliding/full dflash drafts")
    if layer_types is None or (use_swa and SLIDING_ATTENTION not in layer_types):
        sliding = [use_swa] * count
    else:
        sliding = [layer == SLIDING_ATTENTION for layer in layer_types]
    if any(sliding) and dflash.get("swa_window_size", config.get("sliding_window")) is None:
        raise SpeculativeConfigError(
            "DFlash sliding attention requires a window size configured in "
            "dflash_config.swa_window_size or the top-level sliding_window."
        )
    forced = config.get("is_causal")
    if forced is None:
        forced = dflash.get("causal")
    if forced is not None:
        causal = [bool(forced)] * count
    else:
        causal = [bool(layer_types) and layer == SLIDING_ATTENTION for layer in (layer_types or [None] * count)]
    return list(zip(sliding, causal))


def _dflash_agrees(speculative_config, model, num_speculative_tokens, environ):
    """Whether the DFlash drafter runs as trained; raises SpeculativeConfigError for start-up failures."""
    legacy = is_legacy(environ)
    v2 = v2_runner(environ)
    config = _speculators_to_vllm(_load_drafter_config(model))
    trained_path = os.path.join(model, "trained.json")
    trained = _speculators_to_vllm(_load_json(trained_path, "")) if os.path.exists(trained_path) else config
    if legacy:
        block_size = config.get("block_size", 16)
        if num_speculative_tokens > block_size - 1:
            raise SpeculativeConfigError(
                "num_speculative_tokens (%d) must be at most block_size - 1 (%d) of the DFlash drafter."
                % (num_speculative_tokens, block_size - 1)
            )
        config = dict(config, dflash_config=dict(config.get("dflash_config") or {}))
        for key in LEGACY_DRAFTER_KEYS:
            if key in speculative_config:
                if key in ("target_layer_ids", "mask_token_id", "use_swa"):
                    config["dflash_config"][key] = speculative_config[key]
                else:
                    config[key] = speculative_config[key]
        if (
            "use_swa" in speculative_config
            and not speculative_config["use_swa"]
            and "layer_types" not in speculative_config
        ):
            config["layer_types"] = [FULL_ATTENTION] * len(config.get("layer_types") or [None])
    # Trained truth: the V2 lookup of trained.json, with its layout as built on the V2 runner.
    agrees = (
        dflash_taps(config, v2) == dflash_taps(trained, True)
        and dflash_mask_token(config) == dflash_mask_token(trained)
        and dflash_layout(config, v2, legacy) == dflash_layout(trained, True)
    )
    return agrees


def _check_budget(speculative_config, method, num_tokens, max_num_batched_tokens):
    """vllm/config/vllm.py _set_max_num_scheduled_tokens: max_num_batched_tokens must exceed the lookahead."""
    lookahead = (
        num_tokens + 1 if method == "dflash" else (num_tokens if method in METHODS_WITH_DRAFTER | {"mtp"} else 0)
    )
    if lookahead and max_num_batched_tokens is not None and max_num_batched_tokens <= lookahead:
        raise SpeculativeConfigError(
            "VllmConfig does not have enough slots to schedule a token and support the speculative decoding "
            "settings. Got max_num_batched_tokens=%d and num_lookahead_tokens=%d." % (max_num_batched_tokens, lookahead)
        )


@dataclass(frozen=True)
class DraftCounts:
    """Speculative-decoding counters of one request (vLLM's spec_decode_* metrics)."""

    num_drafts: int
    num_draft_tokens: int
    accepted_per_position: tuple

    @property
    def num_accepted_tokens(self):
        return sum(self.accepted_per_position)


@dataclass(frozen=True)
class SpeculativeDecoding:
    """A validated speculative config and whether the drafter runs as trained."""

    method: str
    num_speculative_tokens: int
    drafter_agrees: bool

    @classmethod
    def from_config(cls, speculative_config, environ=None, max_num_batched_tokens=None):
        """Validate `speculative_config` (the --speculative-config dict) like vLLM at start-up.

        `environ` defaults to os.environ. Raises SpeculativeConfigError.
        """
        environ = os.environ if environ is None else environ
        legacy = is_legacy(environ)
        if not isinstance(speculative_config, dict):
            raise SpeculativeConfigError("--speculative-config must be a JSON object.")
        speculative_config = {str(key).replace("-", "_"): value for key, value in speculative_config.items()}
        if not legacy:
            unknown = sorted(key for key in speculative_config if key not in FIELDS)
            if unknown:
                raise SpeculativeConfigError(
                    "1 validation error for SpeculativeConfig\n%s\n  Extra inputs are not permitted "
                    "[type=extra_forbidden, input_value=%r]" % (unknown[0], speculative_config[unknown[0]])
                )
            if speculative_config.get("tensor_parallel_size") is not None:
                raise SpeculativeConfigError(
                    "'tensor_parallel_size' is not a valid argument in the speculative_config. "
                    "Please pass 'draft_tensor_parallel_size' instead."
                )
        model = speculative_config.get("model")
        method = speculative_config.get("method")
        known = METHODS_WITH_DRAFTER | METHODS_WITHOUT_DRAFTER | MTP_METHODS | (LEGACY_METHODS if legacy else set())
        if method is not None and method not in known:
            raise SpeculativeConfigError(
                "1 validation error for SpeculativeConfig\nmethod\n  Input should be 'ngram', 'draft_model', "
                "'suffix', 'custom_class', 'eagle', 'eagle3', 'extract_hidden_states', 'deepseek_mtp', ... "
                "[type=literal_error, input_value=%r]" % (method,)
            )
        if method in MTP_METHODS:
            method = "mtp"
        if method is None:
            name = str(model or "").lower()
            method = next(
                (
                    m
                    for marker, m in (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"))
                    if marker in name
                ),
                "ngram" if model in ("ngram", "[ngram]") else "draft_model",
            )
        needs_drafter = method in METHODS_WITH_DRAFTER or method in LEGACY_METHODS or method == "mtp"
        if needs_drafter and not model and method != "mtp":
            raise SpeculativeConfigError("num_speculative_tokens was provided but without speculative model.")
        drafter = _load_drafter_config(model) if needs_drafter and model else {}
        num_tokens = speculative_config.get("num_speculative_tokens", drafter.get("n_predict"))
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 1:
            raise SpeculativeConfigError(
                "num_speculative_tokens must be provided with speculative model unless the draft model config "
                "contains an n_predict parameter (got %r)." % (num_tokens,)
            )
        _check_budget(speculative_config, method, num_tokens, max_num_batched_tokens)
        agrees = method != "dflash" or _dflash_agrees(speculative_config, model, num_tokens, environ)
        return cls(method=method, num_speculative_tokens=num_tokens, drafter_agrees=agrees)

    def acceptance_rate(self, prompt):
        """Fraction of draft tokens accepted for `prompt`: 0.6-0.8 (by a hash of the prompt) or 0.01."""
        if not self.drafter_agrees:
            return DISAGREEING_ACCEPTANCE
        low, high = AGREEING_ACCEPTANCE
        digest = hashlib.sha256(prompt.encode()).digest()
        return low + (high - low) * int.from_bytes(digest[:4], "big") / 2**32

    def draft(self, prompt, num_tokens):
        """Counters for generating `num_tokens` tokens for `prompt` with drafts of k tokens.

        Each step proposes k tokens, accepts a prefix of them and adds one more token; accepted
        prefix lengths are spread so that accepted / proposed == acceptance_rate(prompt).
        """
        k = self.num_speculative_tokens
        num_drafts, accepted_per_position = draft_counts(k, self.acceptance_rate(prompt), num_tokens)
        return DraftCounts(num_drafts, num_drafts * k, tuple(accepted_per_position))


def draft_counts(k, rate, num_tokens):
    """(drafts, accepted per position) for `num_tokens` tokens with drafts of k tokens at acceptance `rate`.

    Each step proposes k tokens, accepts a prefix of them and adds one more token; accepted prefix lengths are
    spread so that accepted / proposed == rate.
    """
    accepted_per_position = [0] * k
    num_drafts = generated = 0
    carry = 0.0
    while generated < num_tokens:
        carry += rate * k
        accepted = min(k, int(carry))
        carry -= accepted
        for position in range(accepted):
            accepted_per_position[position] += 1
        num_drafts += 1
        generated += accepted + 1
    return num_drafts, accepted_per_position
