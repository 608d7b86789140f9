# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The HTTP client of one vLLM server: GET and POST with a deadline on the whole exchange, JSON answers, completions.

What the other vLLM files build on: readiness (_readiness), acceptance (_acceptance), drain (_drain), the guard's
stall watch (_vllm_stall) and the role's host read (_vllm_host). VllmApiError is the error of them all.
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import ssl
from http.client import HTTPException
from typing import TYPE_CHECKING, Any, Dict, Mapping, Optional, Tuple, TypedDict
from urllib.error import HTTPError, URLError
from urllib.request import BaseHandler, HTTPSHandler, ProxyHandler, Request, build_opener

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._vllm_address import is_loopback

if TYPE_CHECKING:
    from collections.abc import Iterator
    from types import FrameType
    from typing import NoReturn, Protocol

    class _Body(Protocol):
        """What an answer's body is read from: an HTTP response, or the HTTPError of a 4xx or 5xx answer."""

        def read(self, __size: int) -> bytes: ...


# Options of every module that talks to one vLLM server (documented by the gpuops.nvidia.vllm_server doc
# fragment, except served_model_name, whose meaning each module states; request_timeout differs per module).
SERVER_ARGS: Dict[str, Dict[str, Any]] = dict(
    url=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    served_model_name=dict(type="str", required=True, aliases=["model"]),
    validate_certs=dict(type="bool", default=True),
)


# The most of an answer's body read, in bytes (16 MiB). vLLM's /metrics is some hundreds of KiB per engine (vLLM 0.33
# vllm/v1/metrics/loggers.py: a few dozen families, histograms of a few dozen buckets, per engine and model name); its
# other answers are smaller. A body that goes on past it is refused, not read into memory.
MAX_BODY_BYTES = 16 * 1024 * 1024

# What a 401 answer means, by whether this client sent a key (vLLM checks the Bearer token on /v1: a key or none).
_UNAUTHORIZED = {True: " (wrong API key)", False: " (the server asks for an API key; none was sent)"}


class VllmApiError(Exception):
    """The server answered something that makes the measurement impossible (message says what).

    ``status`` is the HTTP status of the answer, or None when the problem is its content.
    """

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


# TLS errors of a connection cut short (a server that stops): the server is going away, not refusing this client.
_TLS_CUT = (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError)


class _Expired(BaseException):
    """Raised by _deadline's SIGALRM handler. A BaseException: no `except OSError` of socket.create_connection (which
    tries the next address), urllib or http.client takes it for an error to handle or retry after."""


class _Seen(TypedDict):
    """How far an exchange got: the bytes of the body read (None: the status line and headers have not all come),
    and the most to read."""

    body: Optional[int]
    limit: int


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    """Raise _Expired in this (the main) thread once `seconds` have passed. A socket timeout bounds each read alone:
    a server that sends a line just before it fires keeps an exchange going for ever. SIGALRM interrupts a blocking
    connect, recv or TLS read (PEP 475: the handler's exception ends the call), so the whole exchange is bounded."""

    def expire(_signum: int, _frame: FrameType | None) -> NoReturn:
        raise _Expired()

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(float(seconds), 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _read_body(response: _Body, seen: _Seen) -> str:
    """The body of `response`, read in pieces so that `seen["body"]` says how much came before a deadline. More than
    `seen["limit"]` bytes: VllmApiError, the rest left unread."""
    read = seen["body"] = 0
    pieces: list[bytes] = []
    while True:
        piece = response.read(65536)
        if not piece:
            return b"".join(pieces).decode("utf-8", "replace")
        read += len(piece)
        seen["body"] = read
        if read > seen["limit"]:
            raise VllmApiError(
                "the answer is over %d bytes (%.0f MiB): not read further" % (seen["limit"], seen["limit"] / 1048576.0)
            )
        pieces.append(piece)


def brief(body: str, limit: int = 300) -> str:
    """`body` on one line, cut after `limit` characters."""
    body = " ".join(body.split())
    return body if len(body) <= limit else body[:limit] + "..."


class Client:
    """HTTP client for one vLLM server: base URL (http://host:port), API key (Bearer), per-request timeout in seconds.

    The standard library's urllib sends the requests, as ansible-core's `Request` would: proxies from the environment
    (`http_proxy`, `no_proxy`), redirects followed. A URL of this host itself (_vllm_address.is_loopback) never goes
    through a proxy: the proxy would reach its own host, not this one. An https URL gets one TLS context, made by ansible-core's
    `make_context`: with `validate_certs`, the CA certificates of the host's usual paths as well as Python's.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        validate_certs: bool = True,
        max_body: int = MAX_BODY_BYTES,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.max_body = max_body
        self.api_key = api_key
        self.timeout = timeout
        self.validate_certs = validate_certs
        handlers: list[BaseHandler] = [ProxyHandler({})] if is_loopback(self.base_url) else []
        if self.base_url.lower().startswith("https:"):
            # Imported here: plain http, the role's servers on the host itself, does not pay for
            # ansible.module_utils.urls (50-100 ms of a module run's CPU; it imports cryptography).
            from ansible.module_utils.urls import make_context

            # One context for every request of this client: making one loads every CA certificate of the host,
            # about 20 ms of CPU, which a readiness or drain poll would pay every 0.2 s.
            handlers.append(HTTPSHandler(context=make_context(validate_certs=validate_certs)))
        self._opener = build_opener(*handlers)

    def request(self, path: str, payload: Any = None) -> Tuple[int, str]:
        """GET `path`, or POST `payload` as JSON; returns (HTTP status, body text).

        HTTP errors are returned as their status; an unreachable server raises ConnectionError with the reason. The
        whole exchange (connection, request, status, headers, body) ends within `timeout` seconds: past it,
        ConnectionError names the URL and what had not come (its cause is a TimeoutError). A body over `max_body`
        bytes raises VllmApiError.
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
        seen: _Seen = {"body": None, "limit": self.max_body}
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

    def _exchange(self, request: Request, path: str, seen: _Seen) -> Tuple[int, str]:
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

    def json(self, path: str, payload: Any = None) -> dict[str, Any]:
        """request() whose 200 answer must be a JSON object; VllmApiError otherwise (with the status and body)."""
        status, body = self.request(path, payload)
        if status != 200:
            raise VllmApiError(
                ("%s %s: HTTP %d %s" % ("POST" if payload is not None else "GET", path, status, brief(body))).rstrip()
                + (_UNAUTHORIZED[bool(self.api_key)] if status == 401 else ""),
                status,
            )
        try:
            answer = json.loads(body)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise VllmApiError("%s: the answer is not a JSON object: %s" % (path, brief(body)))
        return answer

    def complete(self, model: str, prompt: str, max_tokens: int) -> Tuple[str, int]:
        """One /v1/completions request at temperature 0; returns (text, completion tokens)."""
        answer = self.json(
            "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        )
        choices = answer.get("choices") or [{}]
        usage = answer.get("usage") or {}
        return choices[0].get("text", ""), int(usage.get("completion_tokens") or 0)


def client_of(params: Mapping[str, Any]) -> Client:
    """The Client of a module's options: SERVER_ARGS and request_timeout."""
    return Client(params["url"], params["api_key"], params["request_timeout"], params["validate_certs"])


def refused(exc: ConnectionError) -> bool:
    """Whether a ConnectionError from Client.request means that nothing listens on the server's port."""
    return isinstance(exc.__cause__, ConnectionRefusedError)
