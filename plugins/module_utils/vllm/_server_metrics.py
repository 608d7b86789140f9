# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One server's /metrics over HTTP: its samples, and the `model_name` label under which it exports a served name.

Shared by acceptance (_acceptance), drain (_drain) and the guard's stall watch (_vllm_stall).
"""

from __future__ import annotations

from typing import Optional, Tuple

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._http import Client, VllmApiError, brief
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._metrics_text import (
    Sample,
    model_name_labels,
    parse_prometheus,
)

# (label, note): the model_name label to read, and why it is not the name asked for (None when it is).
LabelNote = Tuple[Optional[str], Optional[str]]


def read_samples(client: Client) -> list[Sample]:
    """Samples of GET /metrics (see _metrics_text.parse_prometheus). Raises ConnectionError or VllmApiError, also
    for a body over the client's max_body (_http.MAX_BODY_BYTES) or with more than _metrics_text.MAX_SAMPLES samples."""
    status, body = client.request("/metrics")
    if status != 200:
        raise VllmApiError("GET /metrics: HTTP %d %s" % (status, brief(body)), status)
    return parse_prometheus(body)


def served_names(client: Client) -> list[str] | None:
    """The names GET /v1/models lists, in the server's order (the first is the one its metrics carry), or None
    when the listing cannot be had."""
    try:
        listing = client.json("/v1/models")
    except (ConnectionError, VllmApiError):
        return None
    names: list[str] = [
        entry["id"] for entry in listing.get("data") or () if isinstance(entry, dict) and entry.get("id")
    ]
    return names or None


def metric_model_name(client: Client, served_model_name: str | None, samples: list[Sample]) -> LabelNote:
    """The ``model_name`` label under which a server exports the metrics of `served_model_name`: (label, note).

    vLLM 0.33 labels every metric with its FIRST served model name only (vllm/config/model.py
    get_served_model_name, vllm/v1/metrics/loggers.py), and GET /v1/models lists the served names in order
    (vllm/entrypoints/launchers/api_server/app_state.py, vllm/entrypoints/openai/models/serving.py), so another
    name of the same server is read under the first one. `note` says so (None when the name is the label).
    Raises VllmApiError when the server exports metrics under other names and does not serve `served_model_name`.
    """
    labels = model_name_labels(samples)
    if served_model_name is None or not labels or served_model_name in labels:
        return served_model_name, None
    names = served_names(client)
    if names and served_model_name in names:
        return names[0], (
            "%r is another name of this server: vLLM labels its metrics with the first served name, %r"
            % (served_model_name, names[0])
        )
    if names:
        raise VllmApiError(
            "the server does not serve %r: GET /v1/models lists %s, and /metrics is labelled model_name=%s"
            % (served_model_name, names, ", ".join(labels))
        )
    if len(labels) == 1:
        return labels[0], (
            "GET /v1/models gave no listing; /metrics carries one model_name, %r (vLLM labels its "
            "metrics with the first served name): read as the metrics of %r" % (labels[0], served_model_name)
        )
    raise VllmApiError(
        "/metrics is labelled model_name=%s, not %r, and GET /v1/models gave no listing to tell which "
        "is this server's first name" % (", ".join(labels), served_model_name)
    )
