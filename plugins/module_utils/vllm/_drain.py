# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Draining a vLLM server before its stop: wait until no request runs or waits, a timeout at most.

`drain` polls the scheduler gauges `vllm:num_requests_running` and `vllm:num_requests_waiting` (vLLM 0.33
vllm/v1/metrics/loggers.py) until both are 0 or the timeout passes. The stop that follows is _stop's.
"""

from __future__ import annotations

import socket
import time
from typing import Callable, Optional, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._http import Client, VllmApiError, refused
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._metrics_text import RUNNING, Sample, server_load
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._server_metrics import metric_model_name, read_samples

# Failures of a server that is there and does not answer: a timeout, a connection cut (RemoteDisconnected included).
_NO_ANSWER = (socket.timeout, TimeoutError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)


class Drained(TypedDict):
    """What drain returns; plugins/modules/vllm_drain.py's RETURN says what each key means."""

    drained: bool
    running_at_start: Optional[int]
    waiting_at_start: Optional[int]
    running: Optional[int]
    waiting: Optional[int]
    drain_s: float
    polls: int
    reachable: bool
    metrics: bool
    metrics_model_name: Optional[str]
    msg: str


def _not_yet() -> Drained:
    """drain's result before its first poll ("msg" is set at every way out of its loop)."""
    return {
        "drained": False,
        "running_at_start": None,
        "waiting_at_start": None,
        "running": None,
        "waiting": None,
        "drain_s": 0.0,
        "polls": 0,
        "reachable": True,
        "metrics": True,
        "metrics_model_name": None,
        "msg": "",
    }


def drain(
    client: Client,
    served_model_name: str,
    timeout: float,
    poll_interval: float = _options.DRAIN["poll_interval"].default,
    sleep: Callable[[float], None] = time.sleep,
) -> Drained:
    """Poll the scheduler gauges until no request runs or waits, `timeout` seconds at most (0: one look).

    `served_model_name` may be any name the server serves: its gauges are read under the server's first served
    name (metric_model_name). Returns {"drained" (bool), "running_at_start", "waiting_at_start", "running",
    "waiting" (last reading; None when unknown), "drain_s", "polls", "reachable" (False when the server did not
    answer), "metrics" (False when /metrics has no scheduler gauges), "metrics_model_name" (the model_name label
    read; absent when the server did not answer), "msg"}. Raises VllmApiError when the server does not serve
    `served_model_name`.
    """
    started = time.monotonic()
    result = _not_yet()
    label = note = None
    at_start: Tuple[int, int] | None = None
    while True:
        result["polls"] += 1
        samples = _drain_read(client, result)
        if samples is None:
            break
        if result["polls"] == 1:
            label, note = metric_model_name(client, served_model_name, samples)  # VllmApiError: not this server's name
            result["metrics_model_name"] = label
        load = server_load(samples, label)
        if load is None:
            result["metrics"] = False
            result["msg"] = _no_gauge(samples, label)
            break
        result["running"], result["waiting"] = load
        if at_start is None:
            at_start = load
            result["running_at_start"], result["waiting_at_start"] = load
        elapsed = time.monotonic() - started
        stop = _drain_stop(load, elapsed, timeout, at_start)
        if stop is not None:
            result["drained"], result["msg"] = stop
            break
        sleep(min(poll_interval, max(0.0, timeout - elapsed)))
    result["drain_s"] = round(time.monotonic() - started, 3)
    if note:
        result["msg"] += " (%s)" % note
    return result


def _drain_read(client: Client, result: Drained) -> list[Sample] | None:
    """GET /metrics for drain(): the samples, or None with `result` updated where the drain ends. Raises VllmApiError
    when the server cannot be asked (a URL that leads nowhere, TLS, an answer that is not HTTP, a 4xx): the caller's to
    fix, before any stop."""
    try:
        return read_samples(client)
    except ConnectionError as exc:
        # Nothing listens: no request can be in flight. A server that does not answer in time or cuts the connection
        # (hung, or going away) says nothing of its requests: not drained, and the stop that follows is left to
        # vLLM's own drain (--shutdown-timeout). Anything else (a name that does not resolve, no route) is the URL.
        if refused(exc):
            result["reachable"] = False
            result["drained"] = True
            result["msg"] = "the server does not answer (%s): nothing to drain" % exc
        elif isinstance(exc.__cause__, _NO_ANSWER):
            result["reachable"] = False
            result["msg"] = "the server did not answer GET /metrics (%s): not drained" % exc
        else:
            raise VllmApiError("GET /metrics: %s" % exc)
    except VllmApiError as exc:
        if exc.status is None or exc.status < 500:
            raise
        result["msg"] = "%s: not drained" % exc
    return None


def _drain_stop(
    load: Tuple[int, int], elapsed: float, timeout: float, at_start: Tuple[int, int]
) -> Tuple[bool, str] | None:
    """(drained, msg) when a drain stops at this (running, waiting) `load`, `elapsed` seconds in: no request is left,
    or `timeout` has passed; None to poll again. `at_start`: (running, waiting) at the first reading."""
    if load == (0, 0):
        return True, "drained after %.1f s: no request running or waiting (%s running, %s waiting at the start)" % (
            elapsed,
            *at_start,
        )
    if elapsed >= timeout:
        return False, (
            "not drained within %.0f s: %s request(s) running, %s waiting at the stop (%s and %s at the start)"
            % (timeout, load[0], load[1], *at_start)
        )
    return None


def _no_gauge(samples: list[Sample], label: str | None) -> str:
    """Why a drain sees no scheduler gauge: no vllm: metric at all (--disable-log-stats), or none under `label`."""
    if server_load(samples) is None:
        return (
            "/metrics has no %s gauge (--disable-log-stats?): in-flight requests cannot be seen; the server's own "
            "--shutdown-timeout decides what finishes" % RUNNING
        )
    return "/metrics has %s gauges, but none labelled model_name=%r: in-flight requests of this name cannot be seen" % (
        RUNNING,
        label,
    )
