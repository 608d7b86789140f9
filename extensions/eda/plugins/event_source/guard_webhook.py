# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""gpuops.nvidia.guard_webhook: Alertmanager's webhook for the guard's rulebook (docs/guard.md, "Remediation").

ansible-rulebook runs one playbook per event, one after the other. An event per webhook call would cost a playbook
run per call, and a fleet-wide event (hundreds of calls) would queue for an hour. So this source writes each call
to an inbox on disk and wakes the rulebook only when the inbox was empty: the run it starts takes every call waiting
(the module guard_ledger, take_inbox), and the calls that come while it runs wait for the next one. Calls survive a
restart of ansible-rulebook: a waiting inbox wakes the rulebook when the source starts.

The inbox, shared with plugins/module_utils/gpu/_guard_ledger.py (take_inbox): under an exclusive flock of
STATE_DIR/.lock, each call is a file STATE_DIR/inbox/<nanoseconds>-<random>.json, {"received": ISO time, "payload":
the body} or, for a call answered 4xx, {"received", "rejected": why, "bytes"}; the guard logs a line for each
rejected call. A call without the token is answered 401 and not kept.
"""

from __future__ import annotations

import asyncio
import datetime
import fcntl
import hmac
import json
import logging
import os
import time
import uuid
from typing import Any, Dict, Optional

from aiohttp import web

DOCUMENTATION = r"""
---
short_description: Alertmanager's webhook for the guard, one run for every call waiting.
description:
  - Receives Alertmanager's webhook calls (POST, any path, a JSON object) and keeps each in STATE_DIR/inbox.
  - Puts an event C({"guard_inbox": {"waiting": N}}) on the queue when a call finds the inbox empty, or when the
    last event is O(wake_seconds) old; the playbook it runs takes every call waiting.
  - A body over O(max_bytes) is answered 413, one that is not a JSON object 400; each is kept as a rejected call
    that the guard logs.
options:
  host:
    description: The address to listen on.
    type: str
    default: 127.0.0.1
  port:
    description: The TCP port to listen on.
    type: int
    required: true
  token:
    description: The Bearer token Alertmanager sends (webhook_configs http_config authorization credentials).
    type: str
    required: true
  state_dir:
    description: The guard's state directory (guard_state_dir); the inbox is its subdirectory inbox.
    type: str
    required: true
  max_bytes:
    description: The largest body accepted, in bytes.
    type: int
    default: 1048576
  wake_seconds:
    description: >-
      Seconds after which a call wakes the rulebook again although calls wait: a run that died before it took the
      inbox does not leave it waiting.
    type: float
    default: 30
"""

logger = logging.getLogger(__name__)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat()


class Inbox:
    """STATE_DIR/inbox, written under the flock of STATE_DIR/.lock that the guard's ledger takes to read it."""

    def __init__(self, state_dir: str, wake_seconds: float) -> None:
        self.state_dir, self.wake_seconds = state_dir, wake_seconds
        self.directory = os.path.join(state_dir, "inbox")
        self.woken = float("-inf")

    def _names(self) -> list[str]:
        return [name for name in os.listdir(self.directory) if name.endswith(".json")]

    def put(self, record: Dict[str, Any]) -> Optional[int]:
        """Keep one call; the number of calls waiting when the rulebook is to be woken, else None."""
        os.makedirs(self.directory, exist_ok=True)
        with open(os.path.join(self.state_dir, ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            waiting = len(self._names())
            name = "%020d-%s.json" % (time.time_ns(), uuid.uuid4().hex[:8])
            temporary = os.path.join(self.directory, "." + name + ".tmp")
            with open(temporary, "w") as handle:
                json.dump(record, handle)
            os.replace(temporary, os.path.join(self.directory, name))
        return self._wake(waiting + 1, waiting == 0)

    def pending(self) -> Optional[int]:
        """The number of calls waiting when there are any (at start), else None."""
        os.makedirs(self.directory, exist_ok=True)
        waiting = len(self._names())
        return self._wake(waiting, True) if waiting else None

    def _wake(self, waiting: int, empty_before: bool) -> Optional[int]:
        if empty_before or time.monotonic() - self.woken >= self.wake_seconds:
            self.woken = time.monotonic()
            return waiting
        return None


def _authorized(request: web.Request, token: str) -> bool:
    scheme, given = (request.headers.get("Authorization", "").strip().split(" ", 1) + [""])[:2]
    return scheme == "Bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


async def _body(request: web.Request, max_bytes: int) -> Dict[str, Any]:
    """The record of one call: its payload, or why it is rejected (with the HTTP error to answer)."""
    record: Dict[str, Any] = {"received": _now(), "remote": request.remote, "path": request.path}
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        size = request.content_length
        record["bytes"] = size
        record["rejected"] = (
            "a call of %s bytes, over the %d bytes this webhook takes (guard_webhook_max_bytes): set max_alerts in "
            "Alertmanager's webhook_configs (docs/guard.md)"
            % (size if size is not None else "more than that", max_bytes)
        )
        record["status"] = 413
        return record
    try:
        payload = json.loads(body)
    except ValueError as exc:
        payload, why = None, "the body is not JSON: %s" % exc
    else:
        why = "the body is not a JSON object"
    if isinstance(payload, dict):
        record["payload"] = payload
    else:
        record.update(bytes=len(body), rejected=why, status=400)
    return record


def _handler(queue: Any, inbox: Inbox, token: str, max_bytes: int) -> Any:
    async def webhook(request: web.Request) -> web.Response:
        if not _authorized(request, token):
            raise web.HTTPUnauthorized(text="a Bearer token is required")
        record = await _body(request, max_bytes)
        status = record.pop("status", 200)
        if status != 200:
            logger.warning("guard_webhook: call from %s rejected: %s", record["remote"], record["rejected"])
        waiting = await asyncio.to_thread(inbox.put, record)
        if waiting is not None:
            await queue.put({"guard_inbox": {"waiting": waiting}})
        if status == 413:
            raise web.HTTPRequestEntityTooLarge(max_size=max_bytes, actual_size=record["bytes"] or max_bytes + 1)
        if status == 400:
            raise web.HTTPBadRequest(text=record["rejected"])
        return web.Response(text="kept")

    return webhook


def make_app(queue: Any, inbox: Inbox, token: str, max_bytes: int) -> web.Application:
    """The webhook: POST to any path."""
    app = web.Application(client_max_size=max_bytes)
    app.router.add_post("/{path:.*}", _handler(queue, inbox, token, max_bytes))
    return app


async def main(queue: Any, args: Dict[str, Any]) -> None:
    """Listen until cancelled (ansible-rulebook's source entry point)."""
    for required in ("port", "token", "state_dir"):
        if not args.get(required):
            raise ValueError("guard_webhook: %s is required" % required)
    inbox = Inbox(str(args["state_dir"]), float(args.get("wake_seconds") or 30))
    app = make_app(queue, inbox, str(args["token"]), int(args.get("max_bytes") or 1048576))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, args.get("host") or "127.0.0.1", int(args["port"])).start()
    waiting = await asyncio.to_thread(inbox.pending)
    if waiting is not None:
        await queue.put({"guard_inbox": {"waiting": waiting}})
    try:
        await asyncio.Future()
    finally:
        await runner.cleanup()
