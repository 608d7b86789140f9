# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Fixtures `fake_vllm` and `fake_vllm_tls`: a small in-process HTTP server with vLLM's endpoints, for the HTTP
clients' unit tests; the second serves https with a self-signed certificate for 127.0.0.1 (`state.cert`)."""

from __future__ import annotations

import json
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class FakeVllm:
    """What the fake server answers. Tests change the attributes; `requests` records (method, path, headers).

    Each completion of N tokens adds one draft of `k` tokens per (accepted + 1) tokens generated, with
    `accepted_per_draft` of them accepted (all at the first positions), like vLLM's counters.
    """

    def __init__(self):
        self.api_key = None
        self.health_status = 200
        self.models = ["served"]
        self.k = 4
        self.accepted_per_draft = 3
        self.spec_decode = True
        self.completion_status = 200
        self.metrics_status = 200
        self.drafts = 0
        self.accepted_per_position = [0] * self.k
        self.requests = []
        self.url = None

    def metrics(self):
        lines = [
            "# HELP vllm:num_requests_running Number of requests.",
            "# TYPE vllm:num_requests_running gauge",
            'vllm:num_requests_running{engine="0",model_name="served"} 0.0',
        ]
        if self.spec_decode:
            labels = 'engine="0",model_name="served"'
            lines += [
                "vllm:spec_decode_num_drafts_total{%s} %.1f" % (labels, self.drafts),
                "vllm:spec_decode_num_draft_tokens_total{%s} %.1f" % (labels, self.drafts * self.k),
                "vllm:spec_decode_num_accepted_tokens_total{%s} %.1f" % (labels, sum(self.accepted_per_position)),
                # another model's counters must not be counted
                'vllm:spec_decode_num_drafts_total{engine="1",model_name="other"} 1000.0',
            ]
            lines += [
                'vllm:spec_decode_num_accepted_tokens_per_pos_total{%s,position="%d"} %.1f' % (labels, position, count)
                for position, count in enumerate(self.accepted_per_position)
            ]
        return "\n".join(lines) + "\n"

    def complete(self, max_tokens):
        generated = 0
        while generated < max_tokens:
            self.drafts += 1
            for position in range(self.accepted_per_draft):
                self.accepted_per_position[position] += 1
            generated += self.accepted_per_draft + 1
        return {"choices": [{"text": " the GPU" * max_tokens}], "usage": {"completion_tokens": max_tokens}}


@pytest.fixture
def fake_vllm():
    yield from _serve(FakeVllm())


@pytest.fixture
def fake_vllm_tls(tmp_path):
    # vLLM serves https with --ssl-keyfile and --ssl-certfile (uvicorn); a self-signed certificate for 127.0.0.1.
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(cert), str(key))
    state = FakeVllm()
    state.cert = str(cert)
    yield from _serve(state, context)


def _serve(state, tls=None):

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet
            pass

        def reply(self, status, body):
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            state.requests.append(("GET", self.path, dict(self.headers)))
            if (
                self.path.startswith("/v1")
                and state.api_key
                and self.headers.get("Authorization") != "Bearer " + state.api_key
            ):
                self.reply(401, {"error": "Unauthorized"})
            elif self.path == "/health":
                self.reply(state.health_status, "")
            elif self.path == "/metrics":
                self.reply(state.metrics_status, state.metrics() if state.metrics_status == 200 else "Internal error")
            elif self.path == "/v1/models":
                self.reply(200, {"object": "list", "data": [{"id": name} for name in state.models]})
            else:
                self.reply(404, {"detail": "Not Found"})

        def do_POST(self):  # noqa: N802
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state.requests.append(("POST", self.path, dict(self.headers), request))
            if state.api_key and self.headers.get("Authorization") != "Bearer " + state.api_key:
                self.reply(401, {"error": "Unauthorized"})
            elif state.completion_status != 200:
                self.reply(state.completion_status, {"error": {"message": "EngineCore encountered an issue."}})
            else:
                self.reply(200, state.complete(request["max_tokens"]))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = "%s://127.0.0.1:%d" % ("https" if tls else "http", server.server_port)
    yield state
    server.shutdown()
    server.server_close()
    thread.join(5)
