"""The guard's webhook source (extensions/eda/plugins/event_source/guard_webhook.py) with the ledger that takes its
inbox (_guard_ledger): calls wait on disk, one event wakes one run that takes them all (issue 40 item 5), and a call
answered 413 or 400 ends in a log line (item 6). aiohttp's test server, on loopback; no ansible-rulebook."""

from __future__ import annotations

import asyncio
import json
import runpy
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _guard_ledger

SOURCE = runpy.run_path(
    str(Path(__file__).resolve().parents[2] / "extensions" / "eda" / "plugins" / "event_source" / "guard_webhook.py")
)
TOKEN = {"Authorization": "Bearer t0ken"}


def ledger_params(state_dir, log, **given):
    params = dict(state_dir=str(state_dir), log=str(log), claim_hosts=[], mode="check", interval=600.0)
    params.update(entries=[], decided=[], take_inbox=False, screen=None)
    params.update(given)
    return params


async def _posting(state_dir, steps, max_bytes=1048576):
    """Run `steps` (an async function of the client and the queue) against the webhook."""
    queue: asyncio.Queue = asyncio.Queue()
    inbox = SOURCE["Inbox"](str(state_dir), 30.0)
    async with TestClient(TestServer(SOURCE["make_app"](queue, inbox, "t0ken", max_bytes))) as client:
        await steps(client, queue)


def test_calls_wait_in_the_inbox_and_one_event_wakes_one_run(tmp_path):
    async def steps(client, queue):
        for number in range(3):
            answer = await client.post("/alerts", json={"alerts": [], "groupKey": number}, headers=TOKEN)
            assert answer.status == 200
        # The first call found the inbox empty: one event; the two after it wait for the run that event starts.
        assert queue.qsize() == 1 and queue.get_nowait() == {"guard_inbox": {"waiting": 1}}
        taken = _guard_ledger.act(ledger_params(tmp_path, tmp_path / "guard.jsonl", take_inbox=True), 1000.0)
        assert [call["groupKey"] for call in taken["calls"]] == [0, 1, 2] and taken["lines"] == []
        # Taken: the next call wakes the next run.
        await client.post("/alerts", json={"alerts": []}, headers=TOKEN)
        assert queue.get_nowait() == {"guard_inbox": {"waiting": 1}}

    asyncio.run(_posting(tmp_path, steps))
    # Calls left by a rulebook that stopped wake it when it starts again.
    assert SOURCE["Inbox"](str(tmp_path), 30.0).pending() == 1


def test_rejected_calls_end_in_a_log_line(tmp_path):
    too_big = json.dumps({"alerts": [], "pad": "x" * 2048})

    async def steps(client, queue):
        assert (await client.post("/alerts", data=too_big, headers=TOKEN)).status == 413
        assert (await client.post("/alerts", data="[1, 2]", headers=TOKEN)).status == 400
        assert (await client.post("/alerts", json={"alerts": []})).status == 401
        assert queue.qsize() == 1

    asyncio.run(_posting(tmp_path, steps, max_bytes=1024))
    log = tmp_path / "guard.jsonl"
    taken = _guard_ledger.act(ledger_params(tmp_path, log, take_inbox=True), 1000.0)
    assert taken["calls"] == []
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["why"] for line in lines] == [
        "a call of %d bytes, over the 1024 bytes this webhook takes (guard_webhook_max_bytes): set max_alerts in "
        "Alertmanager's webhook_configs (docs/guard.md)" % len(too_big),
        "the body is not a JSON object",
    ]
    assert lines[0]["call"]["bytes"] == len(too_big) and lines[0]["call"]["path"] == "/alerts"


def test_decided_processes_and_taken_slots_are_refused_without_a_look(tmp_path):
    named = {
        "gpu07": [{"pid": 11, "start_ticks": 500, "alerts": [{"fingerprint": "a"}]}],
        "gpu08": [{"pid": 12, "start_ticks": 600, "alerts": [{"fingerprint": "b"}]}],
        "gpu09": [{"pid": 13, "start_ticks": 700, "alerts": [{"fingerprint": "c"}]}],
    }
    refused = {"host": "gpu07", "mode": "check", "pid": 11, "start_ticks": 500, "why": "not an orphaned holder now"}
    log = tmp_path / "guard.jsonl"
    _guard_ledger.act(ledger_params(tmp_path, log, decided=[refused], claim_hosts=["gpu08"]), 1000.0)
    found = _guard_ledger.act(ledger_params(tmp_path, log, screen=named), 1100.0)
    assert found["hosts"] == {"gpu09": named["gpu09"]}
    whys = {line["host"]: line["why"] for line in map(json.loads, found["lines"])}
    assert whys == {
        "gpu07": "decided 100 s ago (not an orphaned holder now): not looked at again within 600 s (guard_interval)",
        "gpu08": "check remediation of gpu08 100 s ago; at most one per 600 s (guard_interval)",
    }
    assert found["lines"][0].startswith('{"alerts": [{"fingerprint": "a"}]')
    # Another mode, or guard_interval later: looked at again.
    assert _guard_ledger.act(ledger_params(tmp_path, log, screen=named, mode="remediate"), 1100.0)["hosts"] == named
    assert _guard_ledger.act(ledger_params(tmp_path, log, screen=named), 1600.0)["hosts"] == named
