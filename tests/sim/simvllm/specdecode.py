"""Speculative decoding as the simulated vLLM models it: start-up checks and draft acceptance.

This models vLLM's behaviour; it deliberately shares nothing with the collection's validator.

Start-up errors (SpeculativeConfigError), like vLLM: unknown method, no num_speculative_tokens,
a drafter directory (`model`) that is missing or has no readable config.json, and for DFlash
num_speculative_tokens > block_size - 1.

Silent mismatch (the server starts, acceptance collapses to ~1 %), DFlash only: the speculative
config disagrees with the drafter's config.json on
- the tapped target layers: vLLM taps `target_layer_ids + 1` (speculative config's
  `target_layer_ids`, else config.json's `dflash_config.target_layer_ids`); a stale
  `eagle_aux_hidden_state_layer_ids` in config.json wins over both;
- `mask_token_id` (speculative config's, else config.json's `dflash_config.mask_token_id`);
- the attention layout: speculative config's `layer_types`, or all full attention when it sets
  `"use_swa": false`, else config.json's `layer_types`; a mixed sliding/full layout only runs
  as such with env VLLM_USE_V2_MODEL_RUNNER=1, otherwise as all full attention.
Other methods agree with their drafter by construction.
"""

import hashlib
import json
import os
from dataclasses import dataclass

METHODS_WITH_DRAFTER = {"draft_model", "medusa", "mlp_speculator", "eagle", "eagle3", "dflash"}
METHODS_WITHOUT_DRAFTER = {"ngram", "suffix"}
AGREEING_ACCEPTANCE = (0.6, 0.8)
DISAGREEING_ACCEPTANCE = 0.01
FULL_ATTENTION = "full_attention"


class SpeculativeConfigError(ValueError):
    """The speculative config makes vLLM fail at start-up."""


def _is_mtp(method):
    return method == "mtp" or method.endswith("_mtp")


def _load_drafter_config(model):
    """config.json of the drafter directory `model` as a dict."""
    path = os.path.join(model, "config.json")
    try:
        with open(path) as config_file:
            return json.load(config_file)
    except OSError:
        raise SpeculativeConfigError(
            "Invalid repository ID or local directory specified: '%s'. Please verify the model "
            "path or repository ID." % model
        ) from None
    except ValueError as error:
        raise SpeculativeConfigError("Invalid JSON in %s: %s" % (path, error)) from None


def _effective_layout(speculative_config, trained_layout, environ):
    if "layer_types" in speculative_config:
        layout = list(speculative_config["layer_types"])
    elif speculative_config.get("use_swa") is False:
        layout = [FULL_ATTENTION] * len(trained_layout)
    else:
        layout = list(trained_layout)
    if len(set(layout)) > 1 and environ.get("VLLM_USE_V2_MODEL_RUNNER") != "1":
        layout = [FULL_ATTENTION] * len(layout)
    return layout


def _dflash_agrees(speculative_config, drafter, num_speculative_tokens, environ):
    """Check a DFlash drafter's config.json against the speculative config; True when they agree."""
    dflash = drafter.get("dflash_config") or {}
    block_size = drafter.get("block_size", 16)
    if num_speculative_tokens > block_size - 1:
        raise SpeculativeConfigError(
            "num_speculative_tokens (%d) must be at most block_size - 1 (%d) of the DFlash drafter."
            % (num_speculative_tokens, block_size - 1)
        )
    trained_ids = dflash.get("target_layer_ids")
    if trained_ids is None:
        raise SpeculativeConfigError("DFlash drafter config.json has no dflash_config.target_layer_ids.")
    trained_taps = [layer + 1 for layer in trained_ids]
    taps = drafter.get("eagle_aux_hidden_state_layer_ids")
    if taps is None:
        taps = [layer + 1 for layer in speculative_config.get("target_layer_ids", trained_ids)]
    trained_mask = dflash.get("mask_token_id")
    mask = speculative_config.get("mask_token_id", trained_mask)
    trained_layout = drafter.get("layer_types") or [FULL_ATTENTION] * drafter.get("num_hidden_layers", 1)
    layout = _effective_layout(speculative_config, trained_layout, environ)
    return list(taps) == trained_taps and mask == trained_mask and layout == list(trained_layout)


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
    def from_config(cls, speculative_config, environ=None):
        """Validate `speculative_config` (the --speculative-config dict) like vLLM at start-up.

        `environ` defaults to os.environ. Raises SpeculativeConfigError.
        """
        environ = os.environ if environ is None else environ
        if not isinstance(speculative_config, dict):
            raise SpeculativeConfigError("--speculative-config must be a JSON object.")
        model = speculative_config.get("model")
        method = speculative_config.get("method")
        if method is not None and not isinstance(method, str):
            raise SpeculativeConfigError("Unsupported speculative method: %r" % (method,))
        drafter = None
        if model and (method is None or method in METHODS_WITH_DRAFTER or _is_mtp(method)):
            drafter = _load_drafter_config(model)
        if method is None and drafter is not None:
            method = "dflash" if "DFlashDraftModel" in drafter.get("architectures", []) else "draft_model"
        if method is None or not (
            method in METHODS_WITH_DRAFTER or method in METHODS_WITHOUT_DRAFTER or _is_mtp(method)
        ):
            raise SpeculativeConfigError("Unsupported speculative method: %r" % (method,))
        if method in METHODS_WITH_DRAFTER and drafter is None:
            raise SpeculativeConfigError("Speculative method %r needs a drafter model ('model')." % method)
        num_tokens = speculative_config.get("num_speculative_tokens")
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 1:
            raise SpeculativeConfigError(
                "num_speculative_tokens must be a positive integer, got %r." % (num_tokens,)
            )
        agrees = method != "dflash" or _dflash_agrees(speculative_config, drafter, num_tokens, environ)
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
        expected_per_draft = self.acceptance_rate(prompt) * k
        accepted_per_position = [0] * k
        num_drafts = generated = 0
        carry = 0.0
        while generated < num_tokens:
            carry += expected_per_draft
            accepted = min(k, int(carry))
            carry -= accepted
            for position in range(accepted):
                accepted_per_position[position] += 1
            num_drafts += 1
            generated += accepted + 1
        return DraftCounts(num_drafts, num_drafts * k, tuple(accepted_per_position))
