# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vLLM's Prometheus text on /metrics: the metric names read here, the samples of a text, and sums over engines.

No I/O: the text comes from _server_metrics.read_samples (or a test). Source of every metric name: vLLM 0.33
vllm/v1/metrics/loggers.py (PrometheusStatLogger) and vllm/v1/spec_decode/metrics.py (SpecDecodingProm);
scripts/check_vllm_source.py checks them against each release's wheel. With `--disable-log-stats` vLLM creates no
stat logger: /metrics then carries no `vllm:` metric at all.
"""

from __future__ import annotations

import re
from typing import Dict, List, Literal, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._http import VllmApiError

SPEC_DECODE_PREFIX = "vllm:spec_decode_"
DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# vLLM 0.33 labels every metric with model_name = the FIRST served model name only (vllm/config/model.py
# get_served_model_name, vllm/v1/metrics/loggers.py); scripts/check_vllm_source.py checks this against the wheel.
METRIC_MODEL_NAME = "first"

# The most samples read from one /metrics (vLLM's has some thousands per engine): a body of 16 MiB (_http's bound)
# of tiny lines would otherwise become millions of samples, some GiB of memory.
MAX_SAMPLES = 200_000

# One sample: (metric name, {label: value}, value).
Sample = Tuple[str, Dict[str, str], float]

# name{labels} value [timestamp]
_SAMPLE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_LABEL_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


# The counts of SpecCounters, and the metric of each.
CountKey = Literal["drafts", "draft_tokens", "accepted_tokens"]
_COUNTS: Dict[str, CountKey] = {DRAFTS: "drafts", DRAFT_TOKENS: "draft_tokens", ACCEPTED_TOKENS: "accepted_tokens"}


class SpecCounters(TypedDict):
    """The speculative-decoding counters of one reading, summed over engines (counts; floats as Prometheus gives)."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: Dict[int, float]


def parse_prometheus(text: str) -> list[Sample]:
    """Samples of a Prometheus text exposition: [(name, {label: value}, float value)].

    Comment and blank lines are skipped; a line that is not a sample, or more than MAX_SAMPLES samples, raises
    VllmApiError.
    """
    samples: List[Sample] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if len(samples) == MAX_SAMPLES:
            raise VllmApiError("/metrics has more than %d samples: not read further (line %d)" % (MAX_SAMPLES, number))
        match = _SAMPLE_RE.match(line)
        if match is None:
            raise VllmApiError("line %d of /metrics is not a Prometheus sample: %r" % (number, line[:120]))
        labels = {}
        label_text = match.group("labels") or ""
        position = 0
        while position < len(label_text):
            label = _LABEL_RE.match(label_text, position)
            if label is None:
                raise VllmApiError("line %d of /metrics has malformed labels: %r" % (number, line[:120]))
            labels[label.group(1)] = re.sub(r'\\[\\"n]', lambda m: _LABEL_UNESCAPE[m.group(0)], label.group(2))
            position = label.end()
        try:
            value = float(match.group("value"))
        except ValueError:
            raise VllmApiError("line %d of /metrics has a value that is not a number: %r" % (number, line[:120]))
        samples.append((match.group("name"), labels, value))
    return samples


def spec_decode_counters(samples: list[Sample], model_name: str | None = None) -> SpecCounters | None:
    """Speculative-decoding counters summed over engines: {"drafts", "draft_tokens", "accepted_tokens",
    "accepted_per_position" ({position int: count})}, or None when the server exports none (no
    speculative decoding). Samples labelled with another `model_name` are ignored.
    """
    counters: SpecCounters = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0, "accepted_per_position": {}}
    found = False
    for name, labels, value in samples:
        if not name.startswith(SPEC_DECODE_PREFIX):
            continue
        if model_name is not None and labels.get("model_name", model_name) != model_name:
            continue
        key = _COUNTS.get(name)
        if key is not None:
            counters[key] += value
            found = True
        elif name == ACCEPTED_PER_POSITION and labels.get("position", "").isdigit():
            position = int(labels["position"])
            per_position = counters["accepted_per_position"]
            per_position[position] = per_position.get(position, 0.0) + value
    return counters if found else None


def server_load(samples: list[Sample], model_name: str | None = None) -> Tuple[int, int] | None:
    """(running, waiting) requests summed over engines from /metrics samples, or None when the gauges are absent."""
    found = False
    running = waiting = 0.0
    for name, labels, value in samples:
        if name not in (RUNNING, WAITING):
            continue
        if model_name is not None and labels.get("model_name", model_name) != model_name:
            continue
        found = True
        if name == RUNNING:
            running += value
        else:
            waiting += value
    return (int(running), int(waiting)) if found else None


def model_name_labels(samples: list[Sample]) -> list[str]:
    """The `model_name` labels of the vllm: samples, sorted, each once."""
    return sorted(
        {
            labels["model_name"]
            for name, labels, _value in samples
            if name.startswith("vllm:") and "model_name" in labels
        }
    )
