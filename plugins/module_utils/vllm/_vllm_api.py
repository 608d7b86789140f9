# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Talking to a running vLLM server over HTTP: readiness and speculative-decoding acceptance.

Readiness (`wait_ready`): GET /health answers 200, GET /v1/models lists the served model name, and one
completion succeeds. vLLM binds its port early and only listens once the model is loaded, so
"connection refused" means "still loading" (or dead: a watched PID tells which).

Acceptance (`measure_acceptance`): vLLM counts speculative decoding in Prometheus counters on /metrics
(`vllm:spec_decode_num_drafts_total`, `..._num_draft_tokens_total`, `..._num_accepted_tokens_total`,
`..._num_accepted_tokens_per_pos_total{position="k"}`). They are read before and after a warm-up of
fixed prompts at temperature 0; from the differences, acceptance rate = accepted / draft tokens and
mean acceptance length = 1 + accepted / drafts (tokens produced per target forward pass).
`watch_acceptance` reads the same counters twice, `window` seconds apart, without sending anything:
the figures are those of the production traffic in that window.

Draining (`drain`): polls the scheduler gauges `vllm:num_requests_running` and
`vllm:num_requests_waiting` until both are 0 or a timeout passes; `stop_main_process` then SIGTERMs
the server's main process only (vLLM 0.33 drains for `--shutdown-timeout` seconds on SIGTERM of the
API server, entrypoints/launchers/launcher.py) and waits for it and its session to exit.

Source of every metric name and formula: vLLM 0.33 vllm/v1/metrics/loggers.py (PrometheusStatLogger)
and vllm/v1/spec_decode/metrics.py (SpecDecodingProm, SpecDecodingLogging). With `--disable-log-stats`
vLLM creates no stat logger: /metrics then carries no `vllm:` metric at all.
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import ssl
import time
from http.client import HTTPException
from urllib.error import HTTPError, URLError
from urllib.request import HTTPSHandler, ProxyHandler, Request, build_opener

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _proc, _terminate
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _detached
from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_address import is_loopback

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

# name{labels} value [timestamp]
_SAMPLE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')
_LABEL_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


# Options of every module that talks to one vLLM server (documented by the gpuops.nvidia.vllm_server doc
# fragment, except served_model_name, whose meaning each module states; request_timeout differs per module).
SERVER_ARGS = dict(
    url=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    served_model_name=dict(type="str", required=True, aliases=["model"]),
    validate_certs=dict(type="bool", default=True),
)


# What a 401 answer means, by whether this client sent a key (vLLM checks the Bearer token on /v1: a key or none).
_UNAUTHORIZED = {True: " (wrong API key)", False: " (the server asks for an API key; none was sent)"}


class VllmApiError(Exception):
    """The server answered something that makes the measurement impossible (message says what).

    ``status`` is the HTTP status of the answer, or None when the problem is its content.
    """

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


def parse_prometheus(text):
    """Samples of a Prometheus text exposition: [(name, {label: value}, float value)].

    Comment and blank lines are skipped; a line that is not a sample raises VllmApiError.
    """
    samples = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
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


def spec_decode_counters(samples, model_name=None):
    """Speculative-decoding counters summed over engines: {"drafts", "draft_tokens", "accepted_tokens",
    "accepted_per_position" ({position int: count})}, or None when the server exports none (no
    speculative decoding). Samples labelled with another `model_name` are ignored.
    """
    counters = {"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0, "accepted_per_position": {}}
    found = False
    keys = {DRAFTS: "drafts", DRAFT_TOKENS: "draft_tokens", ACCEPTED_TOKENS: "accepted_tokens"}
    for name, labels, value in samples:
        if not name.startswith(SPEC_DECODE_PREFIX):
            continue
        if model_name is not None and labels.get("model_name", model_name) != model_name:
            continue
        if name in keys:
            counters[keys[name]] += value
            found = True
        elif name == ACCEPTED_PER_POSITION and labels.get("position", "").isdigit():
            position = int(labels["position"])
            counters["accepted_per_position"][position] = counters["accepted_per_position"].get(position, 0.0) + value
    return counters if found else None


def acceptance_from_counters(before, after):
    """Differences of two spec_decode_counters() readings and the rates computed from them.

    Returns {"drafts", "draft_tokens", "accepted_tokens" (ints), "accepted_per_position" (list, index =
    draft position), "acceptance_rate" (accepted / draft tokens, None without drafts),
    "mean_acceptance_length" (1 + accepted / drafts, None without drafts), "acceptance_per_position"
    (accepted at k / drafts)}. Raises VllmApiError when a counter went down (the server restarted).
    """
    delta = {}
    for key in ("drafts", "draft_tokens", "accepted_tokens"):
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
    drafts, draft_tokens = delta["drafts"], delta["draft_tokens"]
    delta["accepted_per_position"] = per_position
    delta["acceptance_rate"] = round(delta["accepted_tokens"] / draft_tokens, 4) if draft_tokens else None
    delta["mean_acceptance_length"] = round(1 + delta["accepted_tokens"] / drafts, 3) if drafts else None
    delta["acceptance_per_position"] = [round(count / drafts, 4) for count in per_position] if drafts else []
    return delta


# TLS errors of a connection cut short (a server that stops): the server is going away, not refusing this client.
_TLS_CUT = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)


class _Expired(BaseException):
    """Raised by _deadline's SIGALRM handler. A BaseException: no `except OSError` of socket.create_connection (which
    tries the next address), urllib or http.client takes it for an error to handle or retry after."""


@contextlib.contextmanager
def _deadline(seconds):
    """Raise _Expired in this (the main) thread once `seconds` have passed. A socket timeout bounds each read alone:
    a server that sends a line just before it fires keeps an exchange going for ever. SIGALRM interrupts a blocking
    connect, recv or TLS read (PEP 475: the handler's exception ends the call), so the whole exchange is bounded."""

    def expire(_signum, _frame):
        raise _Expired()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(float(seconds), 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _read_body(response, seen):
    """The body of `response`, read in pieces so that `seen["body"]` says how much came before a deadline."""
    seen["body"] = 0
    pieces = []
    while True:
        piece = response.read(65536)
        if not piece:
            return b"".join(pieces).decode("utf-8", "replace")
        seen["body"] += len(piece)
        pieces.append(piece)


class Client:
    """HTTP client for one vLLM server: base URL (http://host:port), API key (Bearer), per-request timeout in seconds.

    The standard library's urllib sends the requests, as ansible-core's `Request` would: proxies from the environment
    (`http_proxy`, `no_proxy`), redirects followed. A URL of this host itself (_vllm_address.is_loopback) never goes
    through a proxy: the proxy would reach its own host, not this one. An https URL gets one TLS context, made by ansible-core's
    `make_context`: with `validate_certs`, the CA certificates of the host's usual paths as well as Python's.
    """

    def __init__(self, base_url, api_key=None, timeout=30.0, validate_certs=True):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.validate_certs = validate_certs
        handlers = [ProxyHandler({})] if is_loopback(self.base_url) else []
        if self.base_url.lower().startswith("https:"):
            # Imported here: plain http, the role's servers on the host itself, does not pay for
            # ansible.module_utils.urls (50-100 ms of a module run's CPU; it imports cryptography).
            from ansible.module_utils.urls import make_context

            # One context for every request of this client: making one loads every CA certificate of the host,
            # about 20 ms of CPU, which a readiness or drain poll would pay every 0.2 s.
            handlers.append(HTTPSHandler(context=make_context(validate_certs=validate_certs)))
        self._opener = build_opener(*handlers)

    def request(self, path, payload=None):
        """GET `path`, or POST `payload` as JSON; returns (HTTP status, body text).

        HTTP errors are returned as their status; an unreachable server raises ConnectionError with the reason. The
        whole exchange (connection, request, status, headers, body) ends within `timeout` seconds: past it,
        ConnectionError names the URL and what had not come (its cause is a TimeoutError).
        """
        headers = {"Accept": "application/json, text/plain", "User-Agent": "gpuops.nvidia"}
        if self.api_key:
            headers["Authorization"] = "Bearer %s" % self.api_key
        data = None
        if payload is not None:
            headers["Content-Type"] = "application/json"
            data = json.dumps(payload).encode("utf-8")
        request = Request(
            self.base_url + path, data=data, headers=headers, method="POST" if payload is not None else "GET"
        )
        seen = {"body": None}
        try:
            with _deadline(self.timeout):
                return self._exchange(request, path, seen)
        except _Expired:
            missing = (
                "the status line and headers did not all come"
                if seen["body"] is None
                else "the body was still coming (%d bytes read)" % seen["body"]
            )
            why = "no complete answer from %s within %g s: %s" % (request.full_url, self.timeout, missing)
            raise ConnectionError(why) from TimeoutError(why)

    def _exchange(self, request, path, seen):
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return response.getcode(), _read_body(response, seen)
        except HTTPError as exc:
            return exc.code, _read_body(exc, seen) if exc.fp is not None else ""
        except URLError as exc:
            if isinstance(exc.reason, ssl.SSLError) and not isinstance(exc.reason, _TLS_CUT):
                # A certificate this client does not trust, or https to a plain http port: waiting will not help.
                raise VllmApiError("%s: TLS failed: %s" % (path, exc.reason))
            raise ConnectionError(str(exc.reason)) from (exc.reason if isinstance(exc.reason, OSError) else exc)
        except (socket.timeout, OSError) as exc:
            raise ConnectionError(str(exc) or exc.__class__.__name__) from exc
        except HTTPException as exc:
            # What answers is not HTTP, for example an https server asked over http.
            raise VllmApiError("%s: the answer is not HTTP (%s: %s)" % (path, exc.__class__.__name__, exc))

    def json(self, path, payload=None):
        """request() whose 200 answer must be a JSON object; VllmApiError otherwise (with the status and body)."""
        status, body = self.request(path, payload)
        if status != 200:
            raise VllmApiError(
                ("%s %s: HTTP %d %s" % ("POST" if payload is not None else "GET", path, status, _brief(body))).rstrip()
                + (_UNAUTHORIZED[bool(self.api_key)] if status == 401 else ""),
                status,
            )
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise VllmApiError("%s: the answer is not a JSON object: %s" % (path, _brief(body)))
        return answer

    def complete(self, model, prompt, max_tokens):
        """One /v1/completions request at temperature 0; returns (text, completion tokens)."""
        answer = self.json(
            "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        )
        choices = answer.get("choices") or [{}]
        usage = answer.get("usage") or {}
        return choices[0].get("text", ""), int(usage.get("completion_tokens") or 0)


def refused(exc):
    """Whether a ConnectionError from Client.request means that nothing listens on the server's port."""
    return isinstance(exc.__cause__, ConnectionRefusedError)


def _brief(body, limit=300):
    body = " ".join(body.split())
    return body if len(body) <= limit else body[:limit] + "..."


def _ask(request, call):
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


def _check_ready(client, served_model_name, completion_max_tokens):
    """One look: (stage reached, ready, what was seen, models, completion). Raises VllmApiError for a 4xx from /v1."""
    try:
        status, body = client.request("/health")
    except ConnectionError as exc:
        return "health", False, "GET /health: %s" % exc, None, None
    if status != 200:
        return "health", False, ("GET /health: HTTP %d %s" % (status, _brief(body, 100))).rstrip(), None, None
    listing, error = _ask("GET /v1/models", lambda: client.json("/v1/models"))
    if error:
        return "models", False, error, None, None
    models = [entry.get("id") for entry in listing.get("data") or () if isinstance(entry, dict)]
    if served_model_name not in models:
        return "models", False, "GET /v1/models lists %s, not %r" % (models, served_model_name), models, None
    if not completion_max_tokens:
        return "ready", True, "healthy", models, None
    started = time.monotonic()
    answer, error = _ask(
        "POST /v1/completions", lambda: client.complete(served_model_name, "Hello", completion_max_tokens)
    )
    if error:
        return "completion", False, error, models, None
    text, tokens = answer
    completion = {"text": text, "completion_tokens": tokens, "elapsed_s": round(time.monotonic() - started, 3)}
    return "ready", True, "healthy", models, completion


def _process_id(process, proc="/proc"):
    """The _proc.ProcessId to watch for `process`: a PID (None or 0: do not watch), or a (PID, start_ticks) pair
    as in a pidfile ((0, 0): no server process, never alive)."""
    if isinstance(process, int) or process is None:
        return _proc.ProcessId(process, _proc.read_start_ticks(process, proc)) if process else None
    return _proc.ProcessId(*process)


def _not_running_msg(pid, attempts, started, last_error):
    """wait_ready's message when the server process `pid` (0: none) does not run: it exited after `attempts` looks
    since `started` (time.monotonic()), or before the first one."""
    if attempts:
        return "the server process (PID %d) exited after %.1f s, before it was ready (last: %s)" % (
            pid,
            time.monotonic() - started,
            last_error or "no answer yet",
        )
    return "the server process (PID %d) is not running" % pid if pid else "no server process is running"


def wait_ready(
    client, served_model_name, timeout, poll_interval=2.0, process=None, completion_max_tokens=4, proc="/proc"
):
    """Poll until the server is ready (see module docstring), `timeout` seconds at most (0: one look).

    `process`: the server's process, a PID or a (PID, start_ticks) pair as in a detached_process pidfile
    ((0, 0): none); when it is not running the wait ends at once. `completion_max_tokens` 0 skips the
    completion. Returns {"ready", "stage" (health, models, completion or ready), "last_error", "models",
    "completion" ({"text", "completion_tokens", "elapsed_s"} or None), "healthy_after_s" (first /health 200
    with the model listed), "elapsed_s", "attempts", "process_exited", "msg"}.
    """
    started = time.monotonic()
    process = _process_id(process, proc)
    result = {
        "ready": False,
        "stage": "health",
        "last_error": None,
        "models": None,
        "completion": None,
        "healthy_after_s": None,
        "elapsed_s": 0.0,
        "attempts": 0,
        "process_exited": False,
    }
    while True:
        if process is not None and not process.alive(proc):
            result["process_exited"] = True
            result["msg"] = _not_running_msg(process[0], result["attempts"], started, result["last_error"])
            break
        result["attempts"] += 1
        try:
            stage, ready, seen, models, completion = _check_ready(client, served_model_name, completion_max_tokens)
        except VllmApiError as exc:
            result["last_error"] = str(exc)
            result["msg"] = "the server refuses the request: %s" % exc
            break
        result.update(stage=stage, models=models if models is not None else result["models"])
        if stage in ("completion", "ready") and result["healthy_after_s"] is None:
            result["healthy_after_s"] = round(time.monotonic() - started, 3)
        if ready:
            result.update(
                ready=True,
                completion=completion,
                last_error=None,
                msg="ready after %.1f s" % (time.monotonic() - started),
            )
            break
        result["last_error"] = seen
        remaining = timeout - (time.monotonic() - started)
        if remaining <= 0:
            result["msg"] = "not ready after %.0f s (stopped at %s): %s" % (timeout, stage, seen)
            break
        time.sleep(min(poll_interval, remaining))
    result["elapsed_s"] = round(time.monotonic() - started, 3)
    return result


def _read_counters(client, served_model_name, when, what="the warm-up"):
    status, body = client.request("/metrics")
    if status != 200:
        raise VllmApiError("GET /metrics %s %s: HTTP %d %s" % (when, what, status, _brief(body)), status)
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


def served_names(client):
    """The names GET /v1/models lists, in the server's order (the first is the one its metrics carry), or None
    when the listing cannot be had."""
    try:
        listing = client.json("/v1/models")
    except (ConnectionError, VllmApiError):
        return None
    names = [entry.get("id") for entry in listing.get("data") or () if isinstance(entry, dict) and entry.get("id")]
    return names or None


def metric_model_name(client, served_model_name, samples):
    """The ``model_name`` label under which a server exports the metrics of `served_model_name`: (label, note).

    vLLM 0.33 labels every metric with its FIRST served model name only (vllm/config/model.py
    get_served_model_name, vllm/v1/metrics/loggers.py), and GET /v1/models lists the served names in order
    (vllm/entrypoints/launchers/api_server/app_state.py, vllm/entrypoints/openai/models/serving.py), so another
    name of the same server is read under the first one. `note` says so (None when the name is the label).
    Raises VllmApiError when the server exports metrics under other names and does not serve `served_model_name`.
    """
    labels = sorted(
        {
            labels["model_name"]
            for name, labels, _value in samples
            if name.startswith("vllm:") and "model_name" in labels
        }
    )
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


def _raw(counters):
    counters = dict(counters)
    counters["accepted_per_position"] = [
        counters["accepted_per_position"][k] for k in sorted(counters["accepted_per_position"])
    ]
    return counters


def watch_acceptance(client, served_model_name, window, sleep=time.sleep):
    """Acceptance of the traffic the server sees during `window` seconds: counters read before and after.

    Returns acceptance_from_counters() (acceptance_rate and mean_acceptance_length None when no draft was made in
    the window) plus "window_s" (seconds between the two readings), "before" and "after". Raises VllmApiError or
    ConnectionError.
    """
    before = _read_counters(client, served_model_name, "at the start of", "the window")
    started = time.monotonic()
    sleep(window)
    after = _read_counters(client, served_model_name, "at the end of", "the window")
    result = acceptance_from_counters(before, after)
    result.update(window_s=round(time.monotonic() - started, 3), before=_raw(before), after=_raw(after))
    return result


def server_load(samples, model_name=None):
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


def read_samples(client):
    """Samples of GET /metrics (see parse_prometheus). Raises ConnectionError or VllmApiError."""
    status, body = client.request("/metrics")
    if status != 200:
        raise VllmApiError("GET /metrics: HTTP %d %s" % (status, _brief(body)), status)
    return parse_prometheus(body)


def read_load(client, served_model_name):
    """(running, waiting) from GET /metrics; None when the server exports no scheduler gauges. Raises ConnectionError."""
    samples = read_samples(client)
    return server_load(samples, metric_model_name(client, served_model_name, samples)[0])


def drain(client, served_model_name, timeout, poll_interval=1.0, sleep=time.sleep):
    """Poll the scheduler gauges until no request runs or waits, `timeout` seconds at most (0: one look).

    `served_model_name` may be any name the server serves: its gauges are read under the server's first served
    name (metric_model_name). Returns {"drained" (bool), "running_at_start", "waiting_at_start", "running",
    "waiting" (last reading; None when unknown), "drain_s", "polls", "reachable" (False when the server did not
    answer), "metrics" (False when /metrics has no scheduler gauges), "metrics_model_name" (the model_name label
    read; absent when the server did not answer), "msg"}. Raises VllmApiError when the server does not serve
    `served_model_name`.
    """
    started = time.monotonic()
    result = {
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
    }
    label = note = None
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
            result.update(metrics=False, msg=_no_gauge(samples, label))
            break
        result["running"], result["waiting"] = load
        if result["running_at_start"] is None:
            result["running_at_start"], result["waiting_at_start"] = load
        elapsed = time.monotonic() - started
        stop = _drain_stop(load, elapsed, timeout, (result["running_at_start"], result["waiting_at_start"]))
        if stop is not None:
            result["drained"], result["msg"] = stop
            break
        sleep(min(poll_interval, max(0.0, timeout - elapsed)))
    result["drain_s"] = round(time.monotonic() - started, 3)
    if note:
        result["msg"] += " (%s)" % note
    return result


# Failures of a server that is there and does not answer: a timeout, a connection cut (RemoteDisconnected included).
_NO_ANSWER = (socket.timeout, TimeoutError, ConnectionResetError, ConnectionAbortedError, BrokenPipeError)


def _drain_read(client, result):
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
            result.update(reachable=False, drained=True, msg="the server does not answer (%s): nothing to drain" % exc)
        elif isinstance(exc.__cause__, _NO_ANSWER):
            result.update(reachable=False, msg="the server did not answer GET /metrics (%s): not drained" % exc)
        else:
            raise VllmApiError("GET /metrics: %s" % exc)
    except VllmApiError as exc:
        if exc.status is None or exc.status < 500:
            raise
        result["msg"] = "%s: not drained" % exc
    return None


def _drain_stop(load, elapsed, timeout, at_start):
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


def _no_gauge(samples, label):
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


def stop_main_process(record, timeout, session=True, proc="/proc"):
    """SIGTERM the server's main process `record` (pid, start_ticks) alone, wait up to `timeout` s for it to exit
    (and, with `session`, for every process of its session: EngineCore and workers).

    Nothing is SIGKILLed: what is left after `timeout` is for the caller to end. Returns {"signalled" (bool),
    "pid", "exited" (all gone), "stop_s", "left" ([{pid, comm}] still running)}.
    """
    started = time.monotonic()
    result = {"signalled": False, "pid": record[0], "exited": True, "stop_s": 0.0, "left": []}
    target = _terminate.Target({"pid": record[0], "start_ticks": record[1]}, proc)
    if not target.pin():
        return result
    try:
        result["signalled"] = target.send(signal.SIGTERM)
        deadline = started + timeout
        while True:
            left = (
                _detached.session_members(record, proc)
                if session
                else ([] if target.exited() else [{"pid": record[0]}])
            )
            left = [member for member in left if member["pid"] != record[0] or not target.exited()]
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
    finally:
        target.close()
    result.update(
        exited=not left,
        left=[{"pid": m["pid"], "comm": m.get("comm")} for m in left],
        stop_s=round(time.monotonic() - started, 3),
    )
    return result


def measure_acceptance(client, served_model_name, prompts, max_tokens):
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
    result = acceptance_from_counters(before, after)
    for counters in (before, after):
        counters["accepted_per_position"] = [
            counters["accepted_per_position"][k] for k in sorted(counters["accepted_per_position"])
        ]
    result.update(
        completions=len(prompts),
        completion_tokens=completion_tokens,
        elapsed_s=round(elapsed, 3),
        tokens_per_s=round(completion_tokens / elapsed, 1) if elapsed > 0 else None,
        before=before,
        after=after,
    )
    return result
