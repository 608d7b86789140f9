"""The simulated vLLM's serving side: slow requests, shutdown with and without --shutdown-timeout (vLLM 0.33),
--disable-log-stats and the acceptance-collapse knob. Run outside a node, with test_simvllm's fixtures."""

import json
import signal
import threading
import time

# drafter, fake_driver_dir, node and serve are pytest fixtures of test_simvllm, used here by name (serve needs
# fake_driver_dir: a fixture's own fixtures must be importable here too).
from test_simvllm import drafter, fake_driver_dir, node, serve  # noqa: F401  # pylint: disable=unused-import
from test_simvllm import http, metric, metric_samples, refused, wait_for

V2_RUNNER = {"VLLM_USE_V2_MODEL_RUNNER": "1"}


def send_in_background(port, count, max_tokens, results):
    """Start `count` completions of `max_tokens` tokens in threads; each appends (status, answer or error) to results."""

    def one(index):
        try:
            status, body = http(port, "POST", "/v1/completions", {"prompt": "p %d" % index, "max_tokens": max_tokens})
            results.append((status, json.loads(body)))
        except Exception as error:  # noqa: BLE001 (a dropped connection is a result here)
            results.append((None, repr(error)))

    threads = [threading.Thread(target=one, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    return threads


def gauge(port, name):
    return metric(http(port, "GET", "/metrics")[1], name)


def test_slow_requests_drain_within_the_shutdown_timeout_and_new_ones_are_aborted(serve):
    server = serve("--shutdown-timeout", 30, "--max-num-seqs", 3, SIMVLLM_TOKEN_SECONDS="0.05")
    server.wait_ready()
    results = []
    threads = send_in_background(server.port, 4, 30, results)  # 1.5 s each; one waits for a slot
    wait_for(lambda: gauge(server.port, "vllm:num_requests_running") == 3, 5, "3 running")
    assert gauge(server.port, "vllm:num_requests_waiting") == 1
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    status, body = http(server.port, "POST", "/v1/completions", {"prompt": "late", "max_tokens": 5})
    assert status == 200 and json.loads(body)["choices"][0]["finish_reason"] == "abort"
    assert server.process.wait(timeout=10) == 0
    for thread in threads:
        thread.join()
    assert 2.5 < time.monotonic() - started < 6
    assert [
        (status, answer["choices"][0]["finish_reason"], answer["usage"]["completion_tokens"])
        for status, answer in results
    ] == [(200, "length", 30)] * 4
    assert "[shutdown] EngineCore: draining in-flight requests count=4 timeout=30s" in server.log()
    assert refused(server.port)


def test_without_shutdown_timeout_running_requests_are_aborted(serve):
    server = serve(SIMVLLM_TOKEN_SECONDS="0.05")
    server.wait_ready()
    results = []
    threads = send_in_background(server.port, 2, 100, results)  # 5 s each
    wait_for(lambda: gauge(server.port, "vllm:num_requests_running") == 2, 5, "2 running")
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=8) == 0
    for thread in threads:
        thread.join()
    assert all(
        status == 200
        and answer["choices"][0]["finish_reason"] == "abort"
        and answer["usage"]["completion_tokens"] < 100
        for status, answer in results
    ), results
    assert "aborting in-flight requests count=2" in server.log()


def test_disable_log_stats_removes_every_vllm_metric(serve, drafter):
    config = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 15}
    server = serve("--speculative-config", json.dumps(config), "--disable-log-stats", **V2_RUNNER)
    server.wait_ready()
    assert http(server.port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 20})[0] == 200
    status, text = http(server.port, "GET", "/metrics")
    assert status == 200 and "vllm:" not in text


def test_acceptance_collapses_after_the_knob(serve, drafter):
    config = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 15}
    server = serve("--speculative-config", json.dumps(config), SIMVLLM_ACCEPTANCE_COLLAPSE_AFTER="1", **V2_RUNNER)
    server.wait_ready()

    def rate_of_next_requests():
        before = http(server.port, "GET", "/metrics")[1]
        for index in range(3):
            assert http(server.port, "POST", "/v1/completions", {"prompt": "q %d" % index, "max_tokens": 100})[0] == 200
        after = http(server.port, "GET", "/metrics")[1]
        delta = {
            name: metric(after, name) - metric(before, name)
            for name in ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total")
        }
        return delta["vllm:spec_decode_num_accepted_tokens_total"] / delta["vllm:spec_decode_num_draft_tokens_total"]

    assert 0.6 <= rate_of_next_requests() <= 0.8
    time.sleep(1.0)
    assert rate_of_next_requests() < 0.05
    assert (
        len(
            metric_samples(
                http(server.port, "GET", "/metrics")[1], "vllm:spec_decode_num_accepted_tokens_per_pos_total"
            )
        )
        == 15
    )
