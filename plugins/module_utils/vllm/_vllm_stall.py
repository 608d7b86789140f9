# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Is a vLLM engine stalled? Its /health and its own counters, watched for a bounded time (docs/guard.md).

An engine stuck in a CUDA or NCCL call keeps its process alive, so `GET /health` answers 200, while the requests it
admitted stay running and no token comes out. vLLM counts both on /metrics: the gauge `vllm:num_requests_running`
and the counter `vllm:generation_tokens_total` (vLLM 0.33 `vllm/v1/metrics/loggers.py`, recorded at every engine
step; both per engine, summed here). States:

- `stalled`: /health answered 200 at the start and at the end, requests ran at every reading, and the token counter
  did not move for `stall_seconds`;
- `healthy`: /health answered 200 and tokens came, or no request ran at some reading (an idle server);
- `down`: /health did not answer 200 (or did not answer at all);
- `unknown`: /health answered 200 but /metrics has neither figure (`--disable-log-stats`).
"""

from __future__ import annotations

import time
from typing import Callable, Literal, Optional, Sequence, Tuple, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _http, _metrics_text, _server_metrics

GENERATION_TOKENS = "vllm:generation_tokens_total"
# What a watch finds a server to be (see the docstring above).
State = Literal["healthy", "stalled", "down", "unknown"]
STATES: Tuple[State, ...] = ("healthy", "stalled", "down", "unknown")
# (requests running, generation tokens), each None when /metrics lacks it.
Figures = Tuple[Optional[int], Optional[float]]


class StallState(TypedDict):
    """One server's state at the end of its watch; gpu_guard's RETURN says what each key means."""

    state: State
    reason: str
    requests_running: Optional[int]
    generation_tokens: Optional[float]
    watched_s: float


def figures(samples: list[_metrics_text.Sample]) -> Figures:
    """(requests running, generation tokens) summed over engines and models, each None when /metrics lacks it."""
    running: Optional[float] = None
    tokens: Optional[float] = None
    for name, _labels, value in samples:
        if name == _metrics_text.RUNNING:
            running = (running or 0) + value
        elif name == GENERATION_TOKENS:
            tokens = (tokens or 0) + value
    return (None if running is None else int(running)), tokens


def _health(client: _http.Client) -> str | None:
    """None when /health answers 200, else why not."""
    try:
        status, body = client.request("/health")
    except (ConnectionError, _http.VllmApiError) as exc:
        return "GET /health: %s" % exc
    return None if status == 200 else "GET /health: HTTP %d" % status


def _read(client: _http.Client) -> Tuple[Figures, str | None]:
    """(figures of GET /metrics, None), or ((None, None), why not)."""
    try:
        return figures(_server_metrics.read_samples(client)), None
    except (ConnectionError, _http.VllmApiError) as exc:
        return (None, None), "GET /metrics: %s" % exc


def _result(
    state: State, why: str, running: int | None = None, tokens: float | None = None, watched: float = 0.0
) -> StallState:
    return {
        "state": state,
        "reason": why,
        "requests_running": running,
        "generation_tokens": tokens,
        "watched_s": watched,
    }


class _Watch:
    """One server's watch: started, stepped at each poll, finished at the end of the window."""

    def __init__(self, client: _http.Client, stall_seconds: float, clock: Callable[[], float]) -> None:
        self.client, self.stall_seconds, self.clock = client, stall_seconds, clock
        self.result: StallState | None = None
        self.started = clock()
        self.first: float | None = None
        self.tokens: float | None = None
        self.running: int | None = None

    def _elapsed(self) -> float:
        return round(self.clock() - self.started, 3)

    def start(self) -> None:
        """The first look: /health, then the figures the watch starts from."""
        why = _health(self.client)
        if why:
            self.result = _result("down", why)
            return
        self.started = self.clock()
        self._take(*_read(self.client))
        self.first = self.tokens

    def _take(self, found: Figures, why: str | None) -> None:
        """Keep the figures of a reading; a reading without both ends the watch (unknown)."""
        self.running, self.tokens = found
        if why or self.running is None or self.tokens is None:
            why = why or "/metrics has no %s or %s" % (_metrics_text.RUNNING, GENERATION_TOKENS)
            self.result = _result("unknown", why, self.running, self.tokens, self._elapsed())

    def judge(self) -> bool:
        """Healthy as soon as it shows so; the end of the window otherwise (True when the watch is over)."""
        if self.result is not None:
            return True
        watched = self._elapsed()
        if not self.running:
            self.result = _result("healthy", "no request running", self.running, self.tokens, watched)
        elif self.tokens is not None and self.first is not None and self.tokens > self.first:
            words = "%d token(s) generated in %.1f s" % (self.tokens - self.first, watched)
            self.result = _result("healthy", words, self.running, self.tokens, watched)
        elif watched >= self.stall_seconds:
            why = _health(self.client)
            words = why or (
                "%d request(s) running and no token generated for %.1f s while /health answers 200"
                % (self.running, watched)
            )
            self.result = _result("down" if why else "stalled", words, self.running, self.tokens, watched)
        return self.result is not None

    def step(self) -> None:
        """One reading of /metrics."""
        self._take(*_read(self.client))


def watch(
    clients: Sequence[_http.Client],
    stall_seconds: float,
    poll_interval: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[StallState]:
    """The state of each server of `clients` (see the module's docstring), watched at the same time in one thread
    (the HTTP client's deadline uses SIGALRM): [{"state", "reason", "requests_running", "generation_tokens",
    "watched_s"}], in order. A server is judged as soon as its answer is known; the whole watch takes at most
    stall_seconds plus one poll and the requests' deadlines (the clients' timeout each)."""
    watches = [_Watch(client, stall_seconds, clock) for client in clients]
    for one in watches:
        one.start()
    began = clock()
    # Every watch judges each round (no short cut: judge() records a result).
    while sum(1 for one in watches if one.judge()) < len(watches):
        sleep(max(0.0, min(poll_interval, stall_seconds - (clock() - began))))
        for one in watches:
            if one.result is None:
                one.step()
    return [one.result for one in watches if one.result is not None]
