# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The guard's ledger on the controller (docs/guard.md): when each host was last remediated, and the log of every
action and refusal with the alert that caused it.

- `claim`: at most one remediation per host and mode (check or real) per interval. The state file is read and
  rewritten under an exclusive lock (flock), so two runs at the same time cannot both claim a host.
- `append`: one JSON object per line (JSON Lines), appended under the same lock; each line has `time` (UTC, ISO
  8601) and what the caller gives (host, alert, decision, outcome).
- `take_inbox`: the webhook calls that the rulebook's source (extensions/eda/plugins/event_source/guard_webhook.py)
  wrote to STATE_DIR/inbox, one file each, read and removed under the same lock: one run decides them all.
- `remember` and `screen`: a process the look refused (not an orphan now, its PID reused) is decided for `interval`
  seconds; `screen` refuses, without a look at the host, what is decided and every process of a host whose slot is
  taken.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import time
from typing import IO, Any, Dict, Iterable, List, Mapping, Optional, Tuple

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options, _outcome

STATE = "last_remediation.json"
DECIDED = "decided.json"
LOCK = ".lock"
# The source writes each call as INBOX/<nanoseconds>-<random>.json under the lock: {"received": ISO time, "payload":
# the body} or {"received", "rejected": why, "bytes"}, the call it answered 4xx.
INBOX = "inbox"


class _Locked:
    """An exclusive flock on DIR/.lock while inside the `with` (the directory is created when missing)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.handle: IO[str]

    def __enter__(self) -> _Locked:
        os.makedirs(self.directory, exist_ok=True)
        self.handle = open(os.path.join(self.directory, LOCK), "a")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.handle, fcntl.LOCK_UN)
        self.handle.close()


def _read(path: str) -> Dict[str, Any]:
    try:
        with open(path) as handle:
            found = json.load(handle)
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        return {}


def _write(path: str, state: Mapping[str, Any]) -> None:
    temporary = path + ".tmp"
    with open(temporary, "w") as handle:
        json.dump(state, handle, sort_keys=True)
    os.replace(temporary, path)


def claim(state_dir: str, hosts: Iterable[str], mode: str, interval: float, now: float) -> Dict[str, Optional[str]]:
    """Take at `now` the slot of each host of `hosts` that was not taken less than `interval` seconds ago: {host:
    None when taken, else why not}."""
    path = os.path.join(state_dir, STATE)
    found: Dict[str, Optional[str]] = {}
    with _Locked(state_dir):
        state = _read(path)
        for host in hosts:
            found[host] = _refusal(state.get("%s %s" % (mode, host)), None, mode, host, interval, now)
            if found[host] is None:
                state["%s %s" % (mode, host)] = now
        _write(path, state)
    return found


def append(state_dir: str, log: str, entries: Iterable[Mapping[str, Any]], now: float) -> List[str]:
    """Append `entries` (dicts) to the JSON Lines file `log`, each with its time; returns the lines written."""
    stamp = datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat()
    lines = [json.dumps(dict(entry, time=stamp), sort_keys=True) for entry in entries]
    with _Locked(state_dir):
        directory = os.path.dirname(log)
        if directory:
            os.makedirs(directory, exist_ok=True)
        with open(log, "a") as handle:
            for line in lines:
                handle.write(line + "\n")
    return lines


def take_inbox(state_dir: str) -> List[Dict[str, Any]]:
    """The calls waiting in STATE_DIR/inbox, oldest first, removed: [{"received", "payload"} or {"received",
    "rejected", "bytes"}]. A file that cannot be read is a rejected call that says so."""
    inbox = os.path.join(state_dir, INBOX)
    calls: List[Dict[str, Any]] = []
    with _Locked(state_dir):
        names = sorted(name for name in os.listdir(inbox) if name.endswith(".json")) if os.path.isdir(inbox) else []
        for name in names:
            path = os.path.join(inbox, name)
            try:
                with open(path) as handle:
                    found = json.load(handle)
            except (OSError, ValueError) as exc:
                found = {"rejected": "the inbox file %s cannot be read: %s" % (name, exc)}
            calls.append(
                found if isinstance(found, dict) else {"rejected": "the inbox file %s is not an object" % name}
            )
            os.unlink(path)
    return calls


def _key(mode: str, host: str, pid: Any, start_ticks: Any) -> str:
    return "%s %s %s %s" % (mode, host, pid, start_ticks)


def remember(state_dir: str, entries: Iterable[Mapping[str, Any]], interval: float, now: float) -> None:
    """Record the processes the entries decided ({"host", "mode", "pid", "start_ticks", "why"}); forget those decided
    `interval` seconds ago or more."""
    path = os.path.join(state_dir, DECIDED)
    with _Locked(state_dir):
        decided = {key: seen for key, seen in _read(path).items() if _recent(seen, interval, now)}
        for entry in entries:
            decided[_key(entry["mode"], entry["host"], entry["pid"], entry["start_ticks"])] = [now, entry.get("why")]
        _write(path, decided)


def _recent(seen: object, interval: float, now: float) -> bool:
    return isinstance(seen, list) and len(seen) == 2 and isinstance(seen[0], (int, float)) and now - seen[0] < interval


def _refusal(slot: object, seen: object, mode: str, host: str, interval: float, now: float) -> Optional[str]:
    """Why a process is not looked at: its host's slot (the time it was taken) or its decision ([time, why])."""
    if isinstance(slot, (int, float)) and now - slot < interval:
        return "%s remediation of %s %.0f s ago; at most one per %g s (guard_interval)" % (
            mode,
            host,
            now - slot,
            interval,
        )
    if isinstance(seen, list) and _recent(seen, interval, now):
        return "decided %.0f s ago (%s): not looked at again within %g s (guard_interval)" % (
            now - seen[0],
            seen[1],
            interval,
        )
    return None


def screen(
    state_dir: str, hosts: Mapping[str, List[Dict[str, Any]]], mode: str, interval: float, now: float
) -> Tuple[Dict[str, List[Dict[str, Any]]], List[Dict[str, Any]]]:
    """(the hosts and processes left to look at, the refusals): a host remediated less than `interval` seconds ago,
    and a process decided less than `interval` seconds ago, are refused without a look."""
    with _Locked(state_dir):
        slots, decided = _read(os.path.join(state_dir, STATE)), _read(os.path.join(state_dir, DECIDED))
    kept: Dict[str, List[Dict[str, Any]]] = {}
    refused: List[Dict[str, Any]] = []
    for host, named in hosts.items():
        for entry in named:
            seen = decided.get(_key(mode, host, entry["pid"], entry["start_ticks"]))
            why = _refusal(slots.get("%s %s" % (mode, host)), seen, mode, host, interval, now)
            if why is None:
                kept.setdefault(host, []).append(entry)
            else:
                refused.append(dict(entry, host=host, mode=mode, why=why))
    return kept, refused


def _inbox(state_dir: str) -> Tuple[List[Any], List[Dict[str, Any]]]:
    """(the payloads of the calls waiting, a log entry for each call the source rejected)."""
    calls: List[Any] = []
    entries: List[Dict[str, Any]] = []
    for call in take_inbox(state_dir):
        if "payload" in call:
            calls.append(call["payload"])
        else:
            entries.append({"call": {k: v for k, v in call.items() if k != "rejected"}, "why": call.get("rejected")})
    return calls, entries


def argument_spec() -> Dict[str, Any]:
    """guard_ledger's argument spec."""
    return dict(
        state_dir=dict(type="path", required=True),
        log=dict(type="path", required=True),
        claim_hosts=dict(type="list", elements="str", default=[]),
        mode=dict(type="str", choices=["check", "remediate"], default="check"),
        interval=dict(type="float", default=3600.0),
        entries=dict(type="list", elements="dict", default=[]),
        decided=dict(type="list", elements="dict", default=[]),
        take_inbox=dict(type="bool", default=False),
        screen=dict(type="dict"),
    )


def run(params: Mapping[str, Any]) -> _outcome.Outcome:
    """One run of guard_ledger with `params` (the module's validated options), now."""
    try:
        _options.check_numbers(interval=params["interval"])
    except _options.OptionError as exc:
        return _outcome.refused(str(exc))
    try:
        return _outcome.Outcome(act(params, time.time()))
    except OSError as exc:
        return _outcome.refused("the guard's ledger %s or log %s: %s" % (params["state_dir"], params["log"], exc))


def act(params: Mapping[str, Any], now: float) -> Dict[str, Any]:
    """The module guard_ledger: take the inbox, screen, claim, log and remember, in this order, as its options
    (`params`) ask; its result."""
    state_dir, mode, interval = params["state_dir"], params["mode"], params["interval"]
    entries: List[Dict[str, Any]] = []
    calls: List[Any] = []
    if params["take_inbox"]:
        calls, entries = _inbox(state_dir)
    hosts: Dict[str, Any] = {}
    if params["screen"] is not None:
        hosts, refused = screen(state_dir, params["screen"], mode, interval, now)
        entries.extend(refused)
    claims = claim(state_dir, params["claim_hosts"], mode, interval, now) if params["claim_hosts"] else {}
    entries += list(params["entries"]) + list(params["decided"])
    lines = append(state_dir, params["log"], entries, now) if entries else []
    if params["decided"]:
        remember(state_dir, params["decided"], interval, now)
    claimed = [host for host, why in claims.items() if why is None]
    refusals = {host: why for host, why in claims.items() if why is not None}
    changed = bool(lines) or bool(calls) or bool(claimed)
    return dict(changed=changed, claimed=claimed, refusals=refusals, lines=lines, calls=calls, hosts=hosts)
