# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vllm/ _http, _metrics_text, _server_metrics, _readiness, _acceptance, _drain: Prometheus parsing and acceptance
arithmetic, and the HTTP client against the fake_vllm server."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time

import pytest
from ansible.module_utils import urls

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import (
    _acceptance,
    _drain,
    _http,
    _metrics_text,
    _readiness,
    _server_metrics,
    _vllm_address,
)

METRICS = r"""# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="qwen"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="qwen"} 150.0 1732866000000
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="qwen"} 100.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen",position="1"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="qwen",position="0"} 10.0
vllm:spec_decode_num_drafts_total{engine="0",model_name="other \"quoted\", model"} 7.0
vllm:generation_tokens_total{engine="0",model_name="qwen"} 1.5e3
"""


def test_parse_prometheus_reads_labels_values_and_skips_comments():
    samples = _metrics_text.parse_prometheus(METRICS)
    assert len(samples) == 7
    assert samples[0] == ("vllm:spec_decode_num_drafts_total", {"engine": "0", "model_name": "qwen"}, 10.0)
    assert samples[1][2] == 150.0  # a timestamp after the value is ignored
    assert samples[5][1]["model_name"] == 'other "quoted", model'
    assert samples[6][2] == 1500.0


@pytest.mark.parametrize(
    "text, message",
    [
        ("vllm:x_total{engine=0} 1.0", "malformed labels"),
        ("vllm:x_total 1,5", "not a number"),
        ("vllm:x_total", "not a Prometheus sample"),
    ],
)
def test_parse_prometheus_rejects_malformed_lines(text, message):
    with pytest.raises(_http.VllmApiError, match=message):
        _metrics_text.parse_prometheus(text)


def test_spec_decode_counters_filter_by_model_and_are_none_without_speculative_decoding():
    samples = _metrics_text.parse_prometheus(METRICS)
    assert _metrics_text.spec_decode_counters(samples, "qwen") == {
        "drafts": 10.0,
        "draft_tokens": 150.0,
        "accepted_tokens": 100.0,
        "accepted_per_position": {0: 10.0, 1: 9.0},
    }
    assert _metrics_text.spec_decode_counters(samples)["drafts"] == 17.0
    assert (
        _metrics_text.spec_decode_counters(_metrics_text.parse_prometheus('vllm:generation_tokens_total{a="b"} 3'))
        is None
    )


def test_acceptance_from_counter_differences():
    before = {
        "drafts": 10.0,
        "draft_tokens": 150.0,
        "accepted_tokens": 100.0,
        "accepted_per_position": {0: 10.0, 1: 9.0},
    }
    after = {
        "drafts": 30.0,
        "draft_tokens": 450.0,
        "accepted_tokens": 160.0,
        "accepted_per_position": {0: 25.0, 1: 20.0, 2: 4.0},
    }
    result = _acceptance.acceptance_from_counters(before, after)
    assert result == {
        "drafts": 20,
        "draft_tokens": 300,
        "accepted_tokens": 60,
        "accepted_per_position": [15, 11, 4],
        "acceptance_rate": 0.2,
        "mean_acceptance_length": 4.0,
        "acceptance_per_position": [0.75, 0.55, 0.2],
    }
    idle = _acceptance.acceptance_from_counters(before, before)
    assert idle["acceptance_rate"] is None and idle["mean_acceptance_length"] is None
    earlier, later = after, before  # read in this order, the counters went down
    with pytest.raises(_http.VllmApiError, match="went down .* the server restarted"):
        _acceptance.acceptance_from_counters(earlier, later)


def test_measure_acceptance_over_a_warm_up(fake_vllm):
    fake_vllm.api_key = "k"
    fake_vllm.complete(20)  # counters that existed before the warm-up
    client = _http.Client(fake_vllm.url, "k", timeout=5)
    result = _acceptance.measure_acceptance(client, "served", ["one", "two"], 16)
    assert result["drafts"] == 8 and result["draft_tokens"] == 32 and result["accepted_tokens"] == 24
    assert result["acceptance_rate"] == 0.75 and result["mean_acceptance_length"] == 4.0
    assert result["accepted_per_position"] == [8, 8, 8, 0] and result["acceptance_per_position"] == [1.0, 1.0, 1.0, 0.0]
    assert result["completions"] == 2 and result["completion_tokens"] == 32 and result["tokens_per_s"] > 0
    posts = [r for r in fake_vllm.requests if r[0] == "POST"]
    assert [r[3] for r in posts] == [
        {"model": "served", "prompt": p, "max_tokens": 16, "temperature": 0} for p in ("one", "two")
    ]
    assert all(r[2]["Authorization"] == "Bearer k" for r in posts)


def test_measure_acceptance_without_speculative_decoding_or_with_failing_completions(fake_vllm):
    client = _http.Client(fake_vllm.url, timeout=5)
    fake_vllm.completion_status = 500
    with pytest.raises(_http.VllmApiError, match="POST /v1/completions: HTTP 500"):
        _acceptance.measure_acceptance(client, "served", ["one"], 8)
    fake_vllm.spec_decode = False
    with pytest.raises(_http.VllmApiError, match="no vllm:spec_decode_.* speculative decoding is not enabled"):
        _acceptance.measure_acceptance(client, "served", ["one"], 8)


def test_wait_ready_checks_health_models_and_one_completion(fake_vllm):
    result = _readiness.wait_ready(_http.Client(fake_vllm.url, timeout=5), "served", timeout=5, poll_interval=0.05)
    assert result["ready"] and result["stage"] == "ready" and result["attempts"] == 1
    assert result["models"] == ["served"] and result["completion"]["completion_tokens"] == 4
    assert result["healthy_after_s"] is not None and result["last_error"] is None


def _counted_contexts(monkeypatch):
    """The keyword arguments of every make_context call; both names are counted: ansible-core's open_url and
    Request.open call the module's own when given no context."""
    made = []
    real = urls.make_context

    def counted(**kwargs):
        made.append(kwargs)
        return real(**kwargs)

    monkeypatch.setattr(urls, "make_context", counted)
    return made


def test_a_client_makes_one_tls_context_for_all_its_requests(fake_vllm_tls, monkeypatch):
    made = _counted_contexts(monkeypatch)
    client = _http.Client(fake_vllm_tls.url, timeout=5, validate_certs=False)
    result = _readiness.wait_ready(client, "served", timeout=5, poll_interval=0.05)
    assert result["ready"] and client.request("/health")[0] == 200
    # health, models and a completion, then /health again: four requests, one context, made with the client's setting.
    assert made == [{"validate_certs": False}]
    assert len(fake_vllm_tls.requests) == 4


def test_a_client_verifies_the_certificate_of_an_https_server(fake_vllm_tls, monkeypatch):
    result = _readiness.wait_ready(_http.Client(fake_vllm_tls.url, timeout=5), "served", timeout=30)
    # Waiting does not help: the first look ends it.
    assert not result["ready"] and result["attempts"] == 1 and "CERTIFICATE_VERIFY_FAILED" in result["msg"], result
    assert fake_vllm_tls.requests == []
    # Trusted (OpenSSL reads SSL_CERT_FILE when the context loads its default CA certificates): it answers.
    monkeypatch.setenv("SSL_CERT_FILE", fake_vllm_tls.cert)
    result = _readiness.wait_ready(_http.Client(fake_vllm_tls.url, timeout=5), "served", timeout=5)
    assert result["ready"], result


def test_a_plain_http_client_makes_no_tls_context_and_does_not_import_ansibles_url_helpers(fake_vllm, monkeypatch):
    made = _counted_contexts(monkeypatch)
    client = _http.Client(fake_vllm.url, timeout=5)
    assert _readiness.wait_ready(client, "served", timeout=5)["ready"] and made == []
    # In a fresh interpreter, as a module runs: the whole readiness check over http leaves
    # ansible.module_utils.urls (and cryptography, which it imports) unimported.
    code = (
        "import sys\n"
        "from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _http, _readiness\n"
        "result = _readiness.wait_ready(_http.Client(%r, timeout=5), 'served', timeout=5)\n"
        "assert result['ready'], result\n"
        "print(sorted(m for m in sys.modules if m == 'ansible.module_utils.urls' or m.startswith('cryptography')))\n"
    ) % fake_vllm.url
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p.endswith(".collections")))
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "[]", done.stdout + done.stderr


@pytest.mark.parametrize(
    "change, stage, seen",
    [
        ({"health_status": 503}, "health", "GET /health: HTTP 503"),
        ({"models": ["other"]}, "models", "GET /v1/models lists ['other'], not 'served'"),
        ({"completion_status": 500}, "completion", "POST /v1/completions: HTTP 500"),
    ],
)
def test_wait_ready_times_out_with_what_it_saw(fake_vllm, change, stage, seen):
    for name, value in change.items():
        setattr(fake_vllm, name, value)
    started = time.monotonic()
    result = _readiness.wait_ready(_http.Client(fake_vllm.url, timeout=5), "served", timeout=1, poll_interval=0.05)
    assert not result["ready"] and result["stage"] == stage and result["last_error"].startswith(seen), result
    assert result["attempts"] > 1 and 1 <= time.monotonic() - started < 10
    assert result["msg"].startswith("not ready after 1 s (stopped at %s)" % stage)


def test_wait_ready_stops_at_once_on_a_wrong_api_key(fake_vllm):
    fake_vllm.api_key = "right"
    result = _readiness.wait_ready(
        _http.Client(fake_vllm.url, "wrong", timeout=5), "served", timeout=30, poll_interval=0.05
    )
    assert (
        not result["ready"]
        and result["attempts"] == 1
        and "HTTP 401" in result["msg"]
        and "(wrong API key)" in result["msg"]
    )
    # Issue 33: a look that sends no key (vllm_server_host's at a port taken anew) does not blame a wrong key.
    result = _readiness.wait_ready(_http.Client(fake_vllm.url, timeout=5), "served", timeout=0)
    assert "HTTP 401" in result["msg"] and "(the server asks for an API key; none was sent)" in result["msg"], result
    assert "wrong" not in result["msg"], result


def test_wait_ready_while_nothing_listens_and_when_the_server_process_exits():
    with socket.socket() as sock:  # a port nobody listens on: bound, not listening, like vLLM while it loads
        sock.bind(("127.0.0.1", 0))
        url = "http://127.0.0.1:%d" % sock.getsockname()[1]
        client = _http.Client(url, timeout=2)
        result = _readiness.wait_ready(client, "served", timeout=0.2, poll_interval=0.05)
        assert not result["ready"] and result["stage"] == "health" and "refused" in result["last_error"].lower()
        server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
        try:
            started = time.monotonic()
            result = _readiness.wait_ready(client, "served", timeout=30, poll_interval=0.05, process=server.pid)
            assert result["process_exited"] and time.monotonic() - started < 10
            assert result["msg"].startswith("the server process (PID %d) exited after" % server.pid)
        finally:
            server.wait()
        result = _readiness.wait_ready(client, "served", timeout=30, process=(0, 0))
        assert result["process_exited"] and result["attempts"] == 0 and result["msg"] == "no server process is running"


class _Listing:
    """A client stub whose GET /v1/models lists `names` (None: the listing fails)."""

    def __init__(self, names):
        self.names = names
        self.asked = 0

    def json(self, path):
        assert path == "/v1/models"
        self.asked += 1
        if self.names is None:
            raise _http.VllmApiError("GET /v1/models: HTTP 401", 401)
        return {"object": "list", "data": [{"id": name} for name in self.names]}


GAUGES = [
    ("vllm:num_requests_running", {"engine": "0", "model_name": "first"}, 3.0),
    ("vllm:num_requests_waiting", {"engine": "0", "model_name": "first"}, 1.0),
]


def test_metrics_of_another_served_name_are_read_under_the_first():
    """vLLM 0.33 labels metrics with the first served name only (vllm/config/model.py get_served_model_name)."""
    client = _Listing(["first", "alias"])
    label, note = _server_metrics.metric_model_name(client, "alias", GAUGES)
    assert label == "first" and "another name of this server" in note
    assert _metrics_text.server_load(GAUGES, label) == (3, 1)
    assert _server_metrics.metric_model_name(client, "first", GAUGES) == ("first", None) and client.asked == 1


def test_a_name_the_server_does_not_serve_is_refused_not_taken_for_disabled_stats():
    with pytest.raises(_http.VllmApiError, match="does not serve 'other'.*lists \\['first', 'alias'\\]"):
        _server_metrics.metric_model_name(_Listing(["first", "alias"]), "other", GAUGES)
    # no listing (e.g. a wrong API key): the one label /metrics carries is the server's first name
    assert _server_metrics.metric_model_name(_Listing(None), "alias", GAUGES)[0] == "first"
    two = GAUGES + [("vllm:num_requests_running", {"engine": "1", "model_name": "second"}, 0.0)]
    with pytest.raises(_http.VllmApiError, match="no listing"):
        _server_metrics.metric_model_name(_Listing(None), "alias", two)


def test_no_gauge_message_tells_disabled_stats_from_another_label():
    assert "--disable-log-stats" in _drain._no_gauge([("python_info", {}, 1.0)], "x")
    assert "none labelled model_name='x'" in _drain._no_gauge(GAUGES, "x")


@pytest.fixture
def dead_port():
    """A port on 127.0.0.1 that is bound and not listening: a connection is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_is_loopback():
    for url in (
        "http://127.0.0.1:8000",
        "http://127.0.0.2:1",
        "https://[::1]:8000",
        "http://LOCALHOST:8000",
        "http://localhost.:8000",
        "http://[::ffff:127.0.0.1]:8000",
        "http://0.0.0.0:8000",  # what vLLM prints when it binds to every address: a connection reaches this host
        "http://[::]:8000",
    ):
        assert _vllm_address.is_loopback(url), url
    for url in ("http://10.0.0.1:8000", "http://gpu01:8000", "http://[fe80::1]:80", "http://[::ffff:10.0.0.1]:80"):
        assert not _vllm_address.is_loopback(url), url


def test_a_loopback_url_never_goes_through_a_proxy(fake_vllm, dead_port, monkeypatch):
    # A proxy where nothing listens: every request sent through it is refused.
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, "http://127.0.0.1:%d" % dead_port)
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert _http.Client(fake_vllm.url, timeout=5).request("/health")[0] == 200
    for host in ("localhost", "0.0.0.0"):
        assert _http.Client(fake_vllm.url.replace("127.0.0.1", host), timeout=5).request("/health")[0] == 200
    # Another host's URL does go through it (TEST-NET-1: only the proxy can refuse it).
    with pytest.raises(ConnectionError) as refused:
        _http.Client("http://192.0.2.1:8000", timeout=2).request("/health")
    assert _http.refused(refused.value), refused.value


def test_an_answer_that_is_not_http_is_refused_at_once():
    # What a TLS port answers to a plain http request: an alert record, not an HTTP status line.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)

        def answer():
            for _attempt in range(2):
                connection, _address = server.accept()
                with connection:
                    connection.recv(1024)
                    connection.sendall(b"\x15\x03\x03\x00\x02\x02\x46")

        thread = threading.Thread(target=answer, daemon=True)
        thread.start()
        client = _http.Client("http://127.0.0.1:%d" % server.getsockname()[1], timeout=5)
        result = _readiness.wait_ready(client, "served", timeout=30, poll_interval=0.05)
        assert not result["ready"] and result["attempts"] == 1 and "the answer is not HTTP" in result["msg"], result
        with pytest.raises(_http.VllmApiError, match="not HTTP"):
            _drain.drain(client, "served", timeout=30)
        thread.join(5)


def test_drain_nothing_listening_has_nothing_to_drain(dead_port):
    result = _drain.drain(_http.Client("http://127.0.0.1:%d" % dead_port, timeout=2), "served", timeout=30)
    assert result["drained"] and not result["reachable"] and "nothing to drain" in result["msg"], result


def test_drain_a_server_that_does_not_answer_in_time_is_not_drained():
    with socket.socket() as server:  # listening, never accepting: the connection is made, no answer comes
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        client = _http.Client("http://127.0.0.1:%d" % server.getsockname()[1], timeout=0.3)
        result = _drain.drain(client, "served", timeout=30)
    assert not result["drained"] and not result["reachable"], result
    assert result["msg"].startswith("the server did not answer GET /metrics (") and "not drained" in result["msg"]


def test_drain_an_error_answer_is_not_drained_and_a_refusal_raises(fake_vllm, fake_vllm_tls):
    fake_vllm.metrics_status = 500
    result = _drain.drain(_http.Client(fake_vllm.url, timeout=5), "served", timeout=30)
    assert not result["drained"] and result["reachable"] and result["msg"].startswith("GET /metrics: HTTP 500")
    fake_vllm.metrics_status = 404  # a wrong URL: the caller's to fix
    with pytest.raises(_http.VllmApiError, match="HTTP 404"):
        _drain.drain(_http.Client(fake_vllm.url, timeout=5), "served", timeout=30)
    with pytest.raises(_http.VllmApiError, match="TLS failed: .*CERTIFICATE_VERIFY_FAILED"):
        _drain.drain(_http.Client(fake_vllm_tls.url, timeout=5), "served", timeout=30)


def test_drain_refuses_a_url_that_leads_nowhere(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.delenv(name, raising=False)
    # .invalid never resolves (RFC 6761): the URL is wrong, nothing is known of the server's requests.
    with pytest.raises(_http.VllmApiError, match="GET /metrics: "):
        _drain.drain(_http.Client("http://gpuops-test.invalid:8000", timeout=5), "served", timeout=30)


# Issue 33 item 9: a server that sends its answer a line at a time, each line within the per-read socket timeout.
@pytest.fixture
def trickle():
    from trickle import Trickle

    servers = []

    def make(stage):
        servers.append(Trickle(stage=stage, interval=0.2, lasting=20))
        return servers[-1]

    yield make
    for server in servers:
        server.close()


@pytest.mark.parametrize(
    "stage, words",
    [
        ("body", r"the body was still coming \(\d+ bytes read\)"),
        ("headers", r"the status line and headers did not all come"),
    ],
)
def test_every_request_has_a_total_deadline_and_its_failure_names_the_url(trickle, stage, words):
    server = trickle(stage)
    client = _http.Client(server.url, timeout=1.0)
    started = time.monotonic()
    with pytest.raises(ConnectionError) as failed:
        client.request("/metrics")
    elapsed = time.monotonic() - started
    assert elapsed < 1.8, elapsed  # the total deadline, not one second per line
    message = str(failed.value)
    assert message.startswith("no complete answer from %s/metrics within 1 s: " % server.url), message
    assert re.search(words, message), message
    assert isinstance(failed.value.__cause__, TimeoutError)  # read as "did not answer" by the drain


def test_the_looks_of_ready_drain_and_acceptance_end_at_their_deadline(trickle):
    server = trickle("body")
    client = _http.Client(server.url, timeout=0.5)
    started = time.monotonic()
    ready = _readiness.wait_ready(client, "served", timeout=0, completion_max_tokens=0)
    assert (
        not ready["ready"]
        and "GET /health: no complete answer from %s/health within 0.5 s" % server.url in (ready["last_error"])
    ), ready
    drained = _drain.drain(client, "served", timeout=30)
    assert not drained["drained"] and "did not answer GET /metrics" in drained["msg"], drained
    with pytest.raises(ConnectionError, match="^no complete answer from .*/metrics within 0.5 s: "):
        _acceptance.watch_acceptance(client, "served", window=0.1)
    assert time.monotonic() - started < 3.0
    # A later request is not cut short by an alarm left behind.
    time.sleep(0.6)


@pytest.fixture
def endless_metrics():
    """A loopback server whose /metrics answer never ends: comment lines as fast as the client reads them."""
    import socketserver

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            self.request.recv(65536)
            self.request.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: close\r\n\r\n")
            chunk = b"# padding padding padding padding padding padding padding\n" * 1024
            try:
                for _chunk in range(2000):  # about 118 MiB, then it gives up
                    self.request.sendall(chunk)
            except OSError:
                pass  # the client stopped reading: what the test wants

    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield "http://127.0.0.1:%d" % server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_huge_metrics_body_is_not_read_past_the_bound(endless_metrics):
    """Issue 40 item 7: a /metrics body is read up to _http.MAX_BODY_BYTES, then refused (the stall watch: unknown)."""
    client = _http.Client(endless_metrics, timeout=20.0, max_body=4 * 1024 * 1024)
    with pytest.raises(_http.VllmApiError, match=r"the answer is over 4194304 bytes \(4 MiB\): not read further"):
        _server_metrics.read_samples(client)
    assert _http.Client(endless_metrics).max_body == _http.MAX_BODY_BYTES == 16 * 1024 * 1024


def test_more_samples_than_the_bound_are_refused(monkeypatch):
    monkeypatch.setattr(_metrics_text, "MAX_SAMPLES", 3)
    assert len(_metrics_text.parse_prometheus("a 1\nb 2\n# c\nc 3\n")) == 3
    with pytest.raises(_http.VllmApiError, match=r"/metrics has more than 3 samples: not read further \(line 5\)"):
        _metrics_text.parse_prometheus("a 1\nb 2\n# c\nc 3\nd 4\n")
