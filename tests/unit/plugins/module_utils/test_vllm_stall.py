"""Stalled vLLM engines (_vllm_stall.watch) on scripted /health and /metrics answers, on a fake clock."""

from __future__ import annotations

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_stall


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class Server:
    """Answers /health with `health` and /metrics with the next (running, tokens) of `readings` (the last repeats)."""

    def __init__(self, readings, health=200):
        self.readings = list(readings)
        self.health = health

    def request(self, path):
        if path == "/health":
            if isinstance(self.health, Exception):
                raise self.health
            return self.health, ""
        running, tokens = self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]
        lines = []
        if running is not None:
            lines.append('vllm:num_requests_running{engine="0",model_name="m"} %s' % running)
        if tokens is not None:
            lines.append('vllm:generation_tokens_total{engine="0",model_name="m"} %s' % tokens)
        return 200, "\n".join(lines) + "\n"


def watch(*servers, stall_seconds=10.0):
    clock = Clock()
    return _vllm_stall.watch(servers, stall_seconds, poll_interval=1.0, clock=clock, sleep=clock.sleep), clock.now


def test_stalled_when_requests_run_and_no_token_comes_for_the_whole_window():
    (result,), took = watch(Server([(3, 500.0)]))
    assert result["state"] == "stalled" and result["requests_running"] == 3 and result["watched_s"] >= 10.0
    assert "no token generated for 10.0 s" in result["reason"] and took == 10.0


def test_healthy_as_soon_as_a_token_comes_or_no_request_runs():
    (generating, idle, later), took = watch(
        Server([(3, 500.0), (3, 500.0), (3, 501.0)]), Server([(0, 10.0)]), Server([(2, 7.0), (0, 7.0)])
    )
    assert generating["state"] == "healthy" and generating["reason"].startswith("1 token(s) generated")
    assert idle["state"] == "healthy" and idle["reason"] == "no request running" and idle["watched_s"] == 0.0
    assert later["state"] == "healthy" and later["watched_s"] == 1.0
    assert took == 2.0  # all three judged together, none waited for the window


def test_down_and_unknown():
    (refused, failing, no_stats), _took = watch(
        Server([(1, 1.0)], health=ConnectionError("refused")), Server([(1, 1.0)], health=503), Server([(None, None)])
    )
    assert refused["state"] == "down" and "refused" in refused["reason"]
    assert failing["state"] == "down" and failing["reason"] == "GET /health: HTTP 503"
    assert no_stats["state"] == "unknown" and "vllm:num_requests_running" in no_stats["reason"]


def test_health_lost_at_the_end_of_the_window_is_down_not_stalled():
    server = Server([(2, 9.0)])
    clock = Clock()

    def sleep(seconds):
        clock.sleep(seconds)
        if clock.now >= 10.0:
            server.health = 503

    (result,) = _vllm_stall.watch([server], 10.0, poll_interval=1.0, clock=clock, sleep=sleep)
    assert result["state"] == "down"
