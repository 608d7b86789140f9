# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The guard's ledger on the controller (docs/guard.md): when each host was last remediated, and the log of every
action and refusal with the alert that caused it.

- `claim`: at most one remediation per host and mode (check or real) per interval. The state file is read and
  rewritten under an exclusive lock (flock), so two rulebook actions at the same time cannot both claim a host.
- `append`: one JSON object per line (JSON Lines), appended under the same lock; each line has `time` (UTC, ISO
  8601) and what the caller gives (host, alert, decision, outcome).
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
from typing import IO, Any, Dict, Iterable, List, Mapping, Optional, Tuple

STATE = "last_remediation.json"
LOCK = ".lock"


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


def claim(state_dir: str, host: str, mode: str, interval: float, now: float) -> Tuple[bool, Optional[str]]:
    """(True, None) and the host's slot taken at `now`, or (False, why) when it was taken less than `interval`
    seconds ago."""
    path = os.path.join(state_dir, STATE)
    key = "%s %s" % (mode, host)
    with _Locked(state_dir):
        state = _read(path)
        last = state.get(key)
        if isinstance(last, (int, float)) and now - last < interval:
            return False, "%s remediation of %s %.0f s ago; at most one per %g s (guard_interval)" % (
                mode,
                host,
                now - last,
                interval,
            )
        state[key] = now
        temporary = path + ".tmp"
        with open(temporary, "w") as handle:
            json.dump(state, handle, sort_keys=True)
        os.replace(temporary, path)
    return True, None


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
