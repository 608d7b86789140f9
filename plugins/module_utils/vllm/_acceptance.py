# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Speculative-decoding acceptance of a running vLLM server, from its Prometheus counters.

vLLM counts speculative decoding on /metrics (`vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`,
`..._num_accepted_tokens_total`, `..._num_accepted_tokens_per_pos_total{position="k"}`). `measure_acceptance` reads
them before and after a warm-up of fixed prompts at temperature 0; from the differences, acceptance rate = accepted /
draft tokens and mean acceptance length = 1 + accepted / drafts (tokens produced per target forward pass).
`watch_acceptance` reads the same counters twice, `window` seconds apart, without sending anything: the figures are
those of the production traffic in that window.

Source of every formula: vLLM 0.33 vllm/v1/spec_decode/metrics.py (SpecDecodingProm, SpecDecodingLogging).
"""

from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._http import Client, VllmApiError, brief
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._metrics_text import (
    CountKey,
    SpecCounters,
    parse_prometheus,
    spec_decode_counters,
)
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._server_metrics import metric_model_name

NO_LOG_STATS = (
    "/metrics carries no vllm: metric at all: the server runs with --disable-log-stats (vLLM then creates no "
    "stat logger), so acceptance cannot be measured; remove --disable-log-stats to gate on acceptance"
)

DEFAULT_PROMPTS = (
    "Explain in a few sentences why GPU memory must be released before a new server can use it.",
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "List the planets of the solar system in order from the sun, one per line.",
    "Summarize what a tensor-parallel worker does in a large language model server.",
)

_COUNT_KEYS: Tuple[CountKey, ...] = ("drafts", "draft_tokens", "accepted_tokens")


class RawCounters(TypedDict):
    """One reading of the counters as returned: accepted tokens per draft position in a list (index = position)."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: List[float]


class Acceptance(TypedDict):
    """The differences of two readings and the rates computed from them (acceptance_from_counters)."""

    drafts: int
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: List[int]
    acceptance_rate: Optional[float]
    mean_acceptance_length: Optional[float]
    acceptance_per_position: List[float]


class Measured(Acceptance):
    """measure_acceptance's result: the acceptance of its warm-up."""

    completions: int
    completion_tokens: int
    elapsed_s: float
    tokens_per_s: Optional[float]
    before: RawCounters
    after: RawCounters


class Watched(Acceptance):
    """watch_acceptance's result: the acceptance of the traffic in its window."""

    window_s: float
    before: RawCounters
    after: RawCounters


def acceptance_from_counters(before: SpecCounters, after: SpecCounters) -> Acceptance:
    """Differences of two spec_decode_counters() readings and the rates computed from them.

    Returns {"drafts", "draft_tokens", "accepted_tokens" (ints), "accepted_per_position" (list, index =
    draft position), "acceptance_rate" (accepted / draft tokens, None without drafts),
    "mean_acceptance_length" (1 + accepted / drafts, None without drafts), "acceptance_per_position"
    (accepted at k / drafts)}. Raises VllmApiError when a counter went down (the server restarted).
    """
    delta: Dict[CountKey, int] = {}
    for key in _COUNT_KEYS:
        delta[key] = int(round(after[key] - before[key]))
        if delta[key] < 0:
            raise VllmApiError(
                "%s went down from %d to %d during the warm-up: the server restarted" % (key, before[key], after[key])
            )
    positions = sorted(set(after["accepted_per_position"]) | set(before["accepted_per_position"]))
    per_position = (
        [
            int(round(after["accepted_per_position"].get(k, 0.0) - before["accepted_per_position"].get(k, 0.0)))
            for k in range(positions[-1] + 1)
        ]
        if positions
        else []
    )
    drafts, draft_tokens, accepted = delta["drafts"], delta["draft_tokens"], delta["accepted_tokens"]
    return {
        "drafts": drafts,
        "draft_tokens": draft_tokens,
        "accepted_tokens": accepted,
        "accepted_per_position": per_position,
        "acceptance_rate": round(accepted / draft_tokens, 4) if draft_tokens else None,
        "mean_acceptance_length": round(1 + accepted / drafts, 3) if drafts else None,
        "acceptance_per_position": [round(count / drafts, 4) for count in per_position] if drafts else [],
    }


def _read_counters(client: Client, served_model_name: str, when: str, what: str = "the warm-up") -> SpecCounters:
    status, body = client.request("/metrics")
    if status != 200:
        raise VllmApiError("GET /metrics %s %s: HTTP %d %s" % (when, what, status, brief(body)), status)
    samples = parse_prometheus(body)
    label, _note = metric_model_name(client, served_model_name, samples)
    counters = spec_decode_counters(samples, label)
    if counters is None:
        if not any(name.startswith("vllm:") for name, _labels, _value in samples):
            raise VllmApiError(NO_LOG_STATS)
        raise VllmApiError(
            "/metrics has no vllm:spec_decode_* counters for %r%s %s %s: speculative decoding is not enabled"
            % (served_model_name, " (labelled %r)" % label if label != served_model_name else "", when, what)
        )
    return counters


def _raw(counters: SpecCounters) -> RawCounters:
    """A reading as returned: accepted tokens per position as a list, by position."""
    per_position = counters["accepted_per_position"]
    return {
        "drafts": counters["drafts"],
        "draft_tokens": counters["draft_tokens"],
        "accepted_tokens": counters["accepted_tokens"],
        "accepted_per_position": [per_position[k] for k in sorted(per_position)],
    }


def watch_acceptance(
    client: Client, served_model_name: str, window: float, sleep: Callable[[float], None] = time.sleep
) -> Watched:
    """Acceptance of the traffic the server sees during `window` seconds: counters read before and after.

    Returns acceptance_from_counters() (acceptance_rate and mean_acceptance_length None when no draft was made in
    the window) plus "window_s" (seconds between the two readings), "before" and "after". Raises VllmApiError or
    ConnectionError.
    """
    before = _read_counters(client, served_model_name, "at the start of", "the window")
    started = time.monotonic()
    sleep(window)
    after = _read_counters(client, served_model_name, "at the end of", "the window")
    acceptance = acceptance_from_counters(before, after)
    return {
        **acceptance,
        "window_s": round(time.monotonic() - started, 3),
        "before": _raw(before),
        "after": _raw(after),
    }


def measure_acceptance(client: Client, served_model_name: str, prompts: list[str], max_tokens: int) -> Measured:
    """Read the spec-decode counters, run one completion per prompt (temperature 0), read them again.

    Returns acceptance_from_counters() plus "completions", "completion_tokens", "elapsed_s" (warm-up
    seconds), "tokens_per_s" (completion tokens per second of the sequential warm-up), "before" and
    "after" (the raw counters). Raises VllmApiError (no counters, a failed request) or ConnectionError.
    """
    before = _read_counters(client, served_model_name, "before")
    started = time.monotonic()
    completion_tokens = 0
    for prompt in prompts:
        completion_tokens += client.complete(served_model_name, prompt, max_tokens)[1]
    elapsed = time.monotonic() - started
    after = _read_counters(client, served_model_name, "after")
    acceptance = acceptance_from_counters(before, after)
    return {
        **acceptance,
        "completions": len(prompts),
        "completion_tokens": completion_tokens,
        "elapsed_s": round(elapsed, 3),
        "tokens_per_s": round(completion_tokens / elapsed, 1) if elapsed > 0 else None,
        "before": _raw(before),
        "after": _raw(after),
    }
