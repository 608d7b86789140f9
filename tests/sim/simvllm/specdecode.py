"""Speculative decoding as the simulated vLLM models it: start-up checks and draft acceptance.

This models vLLM's behaviour; it deliberately shares nothing with the collection's validator.
The release modelled is SIMVLLM_VERSION (default 0.33.0; the fields and methods of 0.32.0, 0.33.0 and 0.34.0 are in
facts.py, read from their wheels, paths below); below 0.32 (for example "0.26") the older behaviours listed under
LEGACY apply.

Start-up errors (SpeculativeConfigError, the server exits 1), vLLM 0.32 to 0.34:
- a key that is not a SpeculativeConfig field of the release (vllm/config/utils.py: extra="forbid"; `-` read as
  `_`, vllm/engine/arg_utils.py create_speculative_config), `tensor_parallel_size` (refused by
  _verify_args), `speculative_token_tree` (no such field any more); in 0.34 `custom_method`, which vLLM fills
  itself (field(init=False): "Unexpected keyword argument");
- a method outside vLLM's Literal (medusa and mlp_speculator are gone in 0.33, custom_class in 0.34); per-model
  `*_mtp` names are accepted and run as mtp (vllm/config/speculative.py __post_init__). 0.34 also runs a method a
  plugin registered (SIMVLLM_SPECULATIVE_PLUGINS="name=base_method" stands for the plugin) and fails with
  "Unsupported speculative method" for another name (speculator_config.py get_method_config_class);
- no num_speculative_tokens (no n_predict in the drafter config), a missing drafter directory;
- DFlash: sliding layers without a window (qwen3_dflash.py _resolve_layer_attention); a mixed
  sliding/full drafter on the V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0; vllm/config/vllm.py
  _validate_v1_model_runner; 0.34 has no V1 runner and ignores the variable); max_num_batched_tokens <=
  num_speculative_tokens + 1 (vllm/config/vllm.py _set_max_num_scheduled_tokens).
vLLM 0.32 to 0.34 do not compare DFlash num_speculative_tokens with block_size.

Silent mismatch (the server starts, acceptance collapses to ~1 %), DFlash only: what vLLM reads from
the drafter's config.json disagrees with what the drafter was trained on. The training truth is the
drafter directory's `trained.json` when present (the simulated weights), else config.json itself:
- tapped target layers, looked up as vLLM 0.32 to 0.34 do (V2 runner, eagle3_utils.py
  get_eagle3_aux_layers_from_config): top-level eagle_aux_hidden_state_layer_ids, then
  dflash_config.target_layer_ids + 1, dspark_target_layer_ids + 1, top-level target_layer_ids + 1,
  dflash_config/eagle_config layer_ids; V1 runner (gpu_model_runner.py): the first two, then an
  eagle_config dict's eagle_aux_hidden_state_layer_ids replaces them;
- mask token: (eagle_config | dflash_config).mask_token_id, else top-level mask_token_id;
- attention layout and causality (qwen3_dflash.py): layer_types, dflash_config.use_swa, top-level
  is_causal, then dflash_config.causal.

LEGACY (SIMVLLM_VERSION < 0.32): unknown keys are ignored except the drafter keys target_layer_ids,
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

from simvllm import facts

LEGACY_METHODS = {"medusa", "mlp_speculator"}
LEGACY_DRAFTER_KEYS = ("target_layer_ids", "mask_token_id", "layer_types", "use_swa")
AGREEING_ACCEPTANCE = (0.6, 0.8)
DISAGREEING_ACCEPTANCE = 0.01
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"


class SpeculativeConfigError(ValueError):
    """The speculative config makes vLLM fail at start-up."""


def is_legacy(environ):
    """Whether SIMVLLM_VERSION asks for vLLM before 0.32 (the LEGACY behaviours)."""
    return facts.is_legacy(environ)


def v2_runner(environ):
    """Whether vLLM runs its V2 model runner: VLLM_USE_V2_MODEL_RUNNER read as bool(int(value)) (vllm/envs.py);
    unset: V2 in 0.32 and 0.33 (vllm/config/vllm.py use_v2_model_runner), V1 before (LEGACY). 0.34 has no V1 runner
    and does not read the variable. Raises for a value that is no integer."""
    value = environ.get("VLLM_USE_V2_MODEL_RUNNER")
    if not facts.facts_of(environ).v1_runner:
        return True
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
    """Hidden states vLLM taps for a DFlash drafter config (None: the target's default layers)."""
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


def _slots(method, num_tokens, spec, parallel):
    """What max_num_batched_tokens must exceed per request (facts.Release: budget_rule)."""
    if spec.budget_rule == "num_lookahead_tokens":
        if method == "dflash":
            return num_tokens + 1
        return num_tokens if method in spec.methods_with_drafter | {"mtp"} else 0
    if method == "dflash" or (parallel and method == "draft_model"):
        return num_tokens
    return num_tokens - 1 if parallel else (1 if method == "draft_model" else 0)


def _check_budget(method, num_tokens, max_num_batched_tokens, spec, parallel=False):
    """vllm/config/vllm.py _set_max_num_scheduled_tokens: max_num_batched_tokens must exceed the slots per request."""
    lookahead = _slots(method, num_tokens, spec, parallel)
    if lookahead and max_num_batched_tokens is not None and max_num_batched_tokens <= lookahead:
        name = "num_lookahead_tokens" if spec.budget_rule == "num_lookahead_tokens" else "scheduled_token_delta"
        raise SpeculativeConfigError(
            "VllmConfig does not have enough slots to schedule a token and support the speculative decoding "
            "settings. Got max_num_batched_tokens=%d and %s=%d." % (max_num_batched_tokens, name, lookahead)
        )


def _check_fields(speculative_config, spec):
    """Keys that are no SpeculativeConfig field (vllm/config/utils.py: pydantic extra="forbid"), fields vLLM fills
    itself (field(init=False): pydantic refuses them as arguments) and tensor_parallel_size (_verify_args)."""
    for key in sorted(speculative_config):
        if key in spec.set_by_vllm:
            raise SpeculativeConfigError(
                "1 validation error for SpeculativeConfig\n%s\n  Unexpected keyword argument "
                "[type=unexpected_keyword_argument, input_value=%r]" % (key, speculative_config[key])
            )
        if key not in spec.fields:
            raise SpeculativeConfigError(
                "1 validation error for SpeculativeConfig\n%s\n  Extra inputs are not permitted "
                "[type=extra_forbidden, input_value=%r]" % (key, speculative_config[key])
            )
    if speculative_config.get("tensor_parallel_size") is not None:
        raise SpeculativeConfigError(
            "'tensor_parallel_size' is not a valid argument in the speculative_config. "
            "Please pass 'draft_tensor_parallel_size' instead."
        )


def plugin_methods(environ):
    """{method: base method} that SIMVLLM_SPECULATIVE_PLUGINS ("name=base,...", base empty for none) registers, as a
    vLLM plugin does with register_speculative_method (vllm/v1/worker/gpu/spec_decode/speculator_config.py)."""
    found = {}
    for item in (environ.get("SIMVLLM_SPECULATIVE_PLUGINS") or "").split(","):
        if "=" in item:
            name, base = item.split("=", 1)
            found[name.strip()] = base.strip() or None
    return found


def _method(speculative_config, spec, environ):
    """The method vLLM runs (vllm/config/speculative.py __post_init__). Raises SpeculativeConfigError."""
    model, method = speculative_config.get("model"), speculative_config.get("method")
    known = spec.methods | (LEGACY_METHODS if is_legacy(environ) else set())
    if method is not None and method not in known:
        plugins = plugin_methods(environ) if spec.custom_methods else {}
        if method in plugins:  # custom_method = method; method = the base method of its config
            return plugins[method] or "custom"
        if spec.custom_methods and isinstance(method, str):
            raise SpeculativeConfigError("Unsupported speculative method: '%s'" % method)
        raise SpeculativeConfigError(
            "1 validation error for SpeculativeConfig\nmethod\n  Input should be 'ngram', 'draft_model', "
            "'suffix', 'eagle', 'eagle3', 'extract_hidden_states', 'deepseek_mtp', ... "
            "[type=literal_error, input_value=%r]" % (method,)
        )
    if method in spec.mtp_methods:
        return "mtp"
    if method is None:
        name = str(model or "").lower()
        markers = (("eagle-", "eagle"), ("eagle3", "eagle3"), ("dflash", "dflash"), ("dspark", "dspark"))
        method = next(
            (m for marker, m in markers if marker in name), "ngram" if model in ("ngram", "[ngram]") else "draft_model"
        )
    return method


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
        spec = facts.facts_of(environ)
        if not isinstance(speculative_config, dict):
            raise SpeculativeConfigError("--speculative-config must be a JSON object.")
        speculative_config = {str(key).replace("-", "_"): value for key, value in speculative_config.items()}
        if not is_legacy(environ):
            _check_fields(speculative_config, spec)
        method = _method(speculative_config, spec, environ)
        model = speculative_config.get("model")
        needs_drafter = method in spec.methods_with_drafter or method in LEGACY_METHODS or method == "mtp"
        if needs_drafter and not model and method != "mtp":
            raise SpeculativeConfigError("num_speculative_tokens was provided but without speculative model.")
        drafter = _load_drafter_config(model) if needs_drafter and model else {}
        num_tokens = speculative_config.get("num_speculative_tokens", drafter.get("n_predict"))
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 1:
            raise SpeculativeConfigError(
                "num_speculative_tokens must be provided with speculative model unless the draft model config "
                "contains an n_predict parameter (got %r)." % (num_tokens,)
            )
        parallel = bool(speculative_config.get("parallel_drafting"))
        _check_budget(method, num_tokens, max_num_batched_tokens, spec, parallel)
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
