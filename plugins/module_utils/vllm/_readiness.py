# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Is a vLLM server ready? `wait_ready` polls it until it is, or a timeout passes, or its process exits.

Ready: GET /health answers 200, GET /v1/models lists the served model name, and one completion succeeds. vLLM
binds its port early and only listens once the model is loaded, so "connection refused" means "still loading" (or
dead: a watched PID tells which).
"""

from __future__ import annotations

import time
from typing import Any, Callable, List, Literal, Optional, Tuple, TypedDict, TypeVar, Union

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options, _proc
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._http import Client, VllmApiError, brief

# How far a look got: /health, /v1/models, the completion, or all of them (ready).
Stage = Literal["health", "models", "completion", "ready"]
# The server's process as wait_ready takes it: a PID (None or 0: do not watch), or a (PID, start_ticks) pair as in a
# detached_process pidfile ((0, 0): none).
ProcessArg = Union[int, Tuple[int, int], None]
_T = TypeVar("_T")


class Completion(TypedDict):
    """The readiness completion: its text, its tokens, and its seconds."""

    text: str
    completion_tokens: int
    elapsed_s: float


class Readiness(TypedDict):
    """What wait_ready returns; the modules' RETURN says what each key means."""

    ready: bool
    stage: Stage
    last_error: Optional[str]
    models: Optional[List[Any]]
    completion: Optional[Completion]
    healthy_after_s: Optional[float]
    elapsed_s: float
    attempts: int
    process_exited: bool
    msg: str


# One look: (stage reached, ready, what was seen, models listed, completion).
_Look = Tuple[Stage, bool, str, Optional[List[Any]], Optional[Completion]]


def _ask(request: str, call: Callable[[], _T]) -> Tuple[_T | None, str | None]:
    """(call(), None), or (None, why) while the server is not ready: the connection refused or reset, or a 5xx
    answer. A 4xx answer (a wrong API key or model name: waiting will not help) raises VllmApiError."""
    try:
        return call(), None
    except ConnectionError as exc:
        return None, "%s: %s" % (request, exc)
    except VllmApiError as exc:
        if exc.status is not None and 400 <= exc.status < 500:
            raise
        return None, str(exc)


def _check_ready(client: Client, served_model_name: str, completion_max_tokens: int) -> _Look:
    """One look: (stage reached, ready, what was seen, models, completion). Raises VllmApiError for a 4xx from /v1."""
    try:
        status, body = client.request("/health")
    except ConnectionError as exc:
        return "health", False, "GET /health: %s" % exc, None, None
    if status != 200:
        return "health", False, ("GET /health: HTTP %d %s" % (status, brief(body, 100))).rstrip(), None, None
    listing, error = _ask("GET /v1/models", lambda: client.json("/v1/models"))
    if error or listing is None:
        return "models", False, str(error), None, None
    models = [entry.get("id") for entry in listing.get("data") or () if isinstance(entry, dict)]
    if served_model_name not in models:
        return "models", False, "GET /v1/models lists %s, not %r" % (models, served_model_name), models, None
    if not completion_max_tokens:
        return "ready", True, "healthy", models, None
    started = time.monotonic()
    answer, error = _ask(
        "POST /v1/completions", lambda: client.complete(served_model_name, "Hello", completion_max_tokens)
    )
    if error or answer is None:
        return "completion", False, str(error), models, None
    text, tokens = answer
    completion: Completion = {
        "text": text,
        "completion_tokens": tokens,
        "elapsed_s": round(time.monotonic() - started, 3),
    }
    return "ready", True, "healthy", models, completion


def _process_id(process: ProcessArg, proc: str = "/proc") -> _proc.ProcessId | None:
    """The _proc.ProcessId to watch for `process`: a PID (None or 0: do not watch), or a (PID, start_ticks) pair
    as in a pidfile ((0, 0): no server process, never alive)."""
    if isinstance(process, int) or process is None:
        return _proc.ProcessId(process, _proc.read_start_ticks(process, proc)) if process else None
    return _proc.ProcessId(*process)


def _not_running_msg(pid: int, attempts: int, started: float, last_error: str | None) -> str:
    """wait_ready's message when the server process `pid` (0: none) does not run: it exited after `attempts` looks
    since `started` (time.monotonic()), or before the first one."""
    if attempts:
        return "the server process (PID %d) exited after %.1f s, before it was ready (last: %s)" % (
            pid,
            time.monotonic() - started,
            last_error or "no answer yet",
        )
    return "the server process (PID %d) is not running" % pid if pid else "no server process is running"


def _not_yet() -> Readiness:
    """wait_ready's result before its first look ("msg" is set at every way out of its loop)."""
    return {
        "ready": False,
        "stage": "health",
        "last_error": None,
        "models": None,
        "completion": None,
        "healthy_after_s": None,
        "elapsed_s": 0.0,
        "attempts": 0,
        "process_exited": False,
        "msg": "",
    }


def wait_ready(
    client: Client,
    served_model_name: str,
    timeout: float,
    poll_interval: float = _options.READY["poll_interval"].default,
    process: ProcessArg = None,
    completion_max_tokens: int = int(_options.READY["completion_max_tokens"].default),
    proc: str = "/proc",
) -> Readiness:
    """Poll until the server is ready (see module docstring), `timeout` seconds at most (0: one look).

    `process`: the server's process, a PID or a (PID, start_ticks) pair as in a detached_process pidfile
    ((0, 0): none); when it is not running the wait ends at once. `completion_max_tokens` 0 skips the
    completion. Returns {"ready", "stage" (health, models, completion or ready), "last_error", "models",
    "completion" ({"text", "completion_tokens", "elapsed_s"} or None), "healthy_after_s" (first /health 200
    with the model listed), "elapsed_s", "attempts", "process_exited", "msg"}.
    """
    started = time.monotonic()
    watched = _process_id(process, proc)
    result = _not_yet()
    while True:
        if watched is not None and not watched.alive(proc):
            result["process_exited"] = True
            result["msg"] = _not_running_msg(watched[0], result["attempts"], started, result["last_error"])
            break
        result["attempts"] += 1
        try:
            stage, ready, seen, models, completion = _check_ready(client, served_model_name, completion_max_tokens)
        except VllmApiError as exc:
            result["last_error"] = str(exc)
            result["msg"] = "the server refuses the request: %s" % exc
            break
        result["stage"] = stage
        if models is not None:
            result["models"] = models
        if stage in ("completion", "ready") and result["healthy_after_s"] is None:
            result["healthy_after_s"] = round(time.monotonic() - started, 3)
        if ready:
            result["ready"] = True
            result["completion"] = completion
            result["last_error"] = None
            result["msg"] = "ready after %.1f s" % (time.monotonic() - started)
            break
        result["last_error"] = seen
        remaining = timeout - (time.monotonic() - started)
        if remaining <= 0:
            result["msg"] = "not ready after %.0f s (stopped at %s): %s" % (timeout, stage, seen)
            break
        time.sleep(min(poll_interval, remaining))
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    return result
