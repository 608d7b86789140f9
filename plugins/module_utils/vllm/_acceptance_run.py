# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One run of vllm_acceptance: check the options, measure the acceptance rate over a warm-up (or watch it over a
window), and judge it against the minimum.

`run` returns a gpu/_outcome.Outcome; nothing here calls exit_json or fail_json. The measures are _acceptance's.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Union

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options, _outcome
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _acceptance, _http

# The result that judge() ends the run with.
Judged = Union[_acceptance.Measured, _acceptance.Watched]


def argument_spec() -> Dict[str, Any]:
    """vllm_acceptance's argument spec: the server's (_http.SERVER_ARGS) and its own options."""
    return dict(
        _http.SERVER_ARGS,
        prompts=dict(type="list", elements="str"),
        max_tokens=dict(type="int", default=128, no_log=False),
        min_acceptance_rate=dict(type="float"),
        request_timeout=dict(type="float", default=120.0),
        window=dict(type="float"),
    )


def run(params: Mapping[str, Any]) -> _outcome.Outcome:
    """vllm_acceptance with `params` (the module's validated options)."""
    prompts: List[str] = params["prompts"] if params["prompts"] is not None else list(_acceptance.DEFAULT_PROMPTS)
    if not prompts or params["max_tokens"] < 1:
        return _outcome.refused("the warm-up needs at least one prompt and max_tokens >= 1")
    try:
        _options.check_numbers(
            positive=("window",),
            window=params["window"],
            request_timeout=params["request_timeout"],
            min_acceptance_rate=params["min_acceptance_rate"],
        )
    except _options.OptionError as exc:
        return _outcome.refused(str(exc))
    if params["min_acceptance_rate"] is not None and params["min_acceptance_rate"] > 1:
        return _outcome.refused("min_acceptance_rate must be between 0 and 1, got %s" % params["min_acceptance_rate"])
    client = _http.client_of(params)
    try:
        if params["window"] is not None:
            return watch(client, params)
        return measure(client, params, prompts)
    except (_http.VllmApiError, ConnectionError) as exc:
        return _outcome.refused("%s: acceptance not measured: %s" % (params["url"], exc))


def measure(client: _http.Client, params: Mapping[str, Any], prompts: List[str]) -> _outcome.Outcome:
    """The warm-up: completions sent, the counters read before and after."""
    result = _acceptance.measure_acceptance(client, params["served_model_name"], prompts, params["max_tokens"])
    rate, mean = result["acceptance_rate"], result["mean_acceptance_length"]
    if rate is None or mean is None:
        msg = (
            "%s: no draft token was counted during the warm-up of %d completion(s): speculative decoding is not active"
        )
        return _outcome.Outcome(dict(msg=msg % (params["url"], result["completions"]), **result), failed=True)
    summary = "acceptance rate %.1f%% (%d of %d draft tokens), mean acceptance length %.2f, %s tok/s" % (
        100 * rate,
        result["accepted_tokens"],
        result["draft_tokens"],
        mean,
        result["tokens_per_s"],
    )
    return judge(params, rate, result, summary)


def watch(client: _http.Client, params: Mapping[str, Any]) -> _outcome.Outcome:
    """The O(window) mode: counters read twice, nothing sent."""
    result = _acceptance.watch_acceptance(client, params["served_model_name"], params["window"])
    rate, mean = result["acceptance_rate"], result["mean_acceptance_length"]
    if rate is None or mean is None:
        msg = "%s: no draft in %.0f s: no speculative traffic to judge" % (params["url"], result["window_s"])
        return _outcome.Outcome(dict(changed=False, msg=msg, **result))
    summary = "acceptance rate %.1f%% (%d of %d draft tokens), mean acceptance length %.2f (%d drafts) over %.0f s" % (
        100 * rate,
        result["accepted_tokens"],
        result["draft_tokens"],
        mean,
        result["drafts"],
        result["window_s"],
    )
    return judge(params, rate, result, summary)


def judge(params: Mapping[str, Any], rate: float, result: Judged, summary: str) -> _outcome.Outcome:
    """Failed when `rate` (the result's acceptance rate) is below O(min_acceptance_rate), in both modes."""
    threshold = params["min_acceptance_rate"]
    if threshold is not None and rate < threshold:
        msg = "%s: %s is below the minimum %.1f%%" % (params["url"], summary, 100 * threshold)
        return _outcome.Outcome(dict(msg=msg, **result), failed=True)
    return _outcome.Outcome(dict(changed=False, msg="%s: %s" % (params["url"], summary), **result))
