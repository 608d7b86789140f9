# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Which vLLM release an executable runs (on the host), and which release's facts validate it (on the controller).

read_version(executable) -> {"version", "source", "error"}: from the package metadata of the Python environment the
executable runs in (``<prefix>/lib/pythonX.Y/site-packages/vllm-X.dist-info/METADATA``, the file
``importlib.metadata.version("vllm")`` reads, which vLLM's own ``vllm --version`` prints), else from
``EXECUTABLE --version`` (at most VERSION_TIMEOUT seconds).

resolve(version) -> {"version", "facts", "warning", "problem"}: the release of VERSIONS whose tables validate an
instance of that version. A release of VERSIONS: itself. Another patch release of a known series: that series'
release, with a warning. Newer than the newest known: the newest known, with a warning that names both. Older than
the oldest known: refused (``problem``) with the supported range.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
from typing import Dict, List, Literal, Optional, Tuple, TypedDict, cast

# A release of VERSIONS: the versions whose fact tables the collection keeps.
Release = Literal["0.32.0", "0.33.0", "0.34.0"]
# The vLLM releases whose wheels the collection's tables were read from, oldest first (scripts/check_vllm_source.py
# checks each one; _speculative_vllm, _vllm_facts and the simulator key their tables by these).
VERSIONS: Tuple[Release, ...] = ("0.32.0", "0.33.0", "0.34.0")
# Seconds `vllm --version` may take (vLLM imports torch before it answers: seconds to tens of seconds).
VERSION_TIMEOUT = 60
_NUMBER = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")


class VersionRead(TypedDict):
    """What read_version found: the version text or None, where it was read, why none was."""

    version: Optional[str]
    source: Optional[str]
    error: Optional[str]


class Resolved(TypedDict):
    """What resolve gives: the version read, the release whose facts apply (None when refused), a warning, a
    refusal."""

    version: Optional[str]
    facts: Optional[Release]
    warning: Optional[str]
    problem: Optional[str]


def parse(text: object) -> Optional[Tuple[int, ...]]:
    """(major, minor, patch) of a version text such as "0.34.0", "0.34.1rc1", "0.35.0.dev12+gabc" or None."""
    match = _NUMBER.match(str(text or "").strip())
    return tuple(int(part or 0) for part in match.groups()) if match else None


def _known(version: Release) -> Tuple[int, ...]:
    """(major, minor, patch) of a release of VERSIONS, which are all version numbers."""
    return cast(Tuple[int, ...], parse(version))


def supported_range() -> str:
    return "%s to %s" % (".".join(VERSIONS[0].split(".")[:2]), ".".join(VERSIONS[-1].split(".")[:2]))


def resolve(version: Optional[str]) -> Resolved:
    """See the module docstring. `version` is the text the host read (None when it could not be read)."""
    found: Resolved = {"version": version, "facts": None, "warning": None, "problem": None}
    number = parse(version)
    if number is None:
        found["problem"] = "the vLLM version %r is not a version number" % (version,)
        return found
    series: Dict[Tuple[int, ...], Release] = dict((_known(known)[:2], known) for known in VERSIONS)
    if number[:2] in series:
        found["facts"] = series[number[:2]]
        if found["facts"] != version:
            found["warning"] = (
                "vLLM %s is validated against the facts of vLLM %s, the release of its series this collection was "
                "checked against" % (version, found["facts"])
            )
    elif number > _known(VERSIONS[-1]):
        found["facts"] = VERSIONS[-1]
        found["warning"] = (
            "vLLM %s is newer than the releases this collection knows (%s): its speculative config, flags, metrics "
            "and shutdown are validated against vLLM %s's; a field or method that %s added is refused, one it "
            "removed is not" % (version, supported_range(), VERSIONS[-1], version)
        )
    else:
        found["problem"] = (
            "vLLM %s is older than the releases this collection supports (%s): upgrade the instance's vLLM, or "
            "use a release of this collection that supports %s" % (version, supported_range(), version)
        )
    return found


def _interpreter(executable: str) -> Optional[str]:
    """The Python interpreter a console script names in its first lines (pip's `#!PYTHON`, or its `/bin/sh` form
    for long paths: `'''exec' "PYTHON" "$0" "$@"`), or None."""
    try:
        with open(executable, "rb") as handle:
            head = handle.read(1024).decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    if not head or not head[0].startswith("#!"):
        return None
    words = head[0][2:].split()
    if words and os.path.basename(words[0]).startswith("python"):
        return words[0]
    for line in head[1:3]:
        match = re.match(r"""^'''exec' "?([^" ]+)"?""", line)
        if match:
            return match.group(1)
    return None


def _prefixes(executable: str) -> List[str]:
    """Environment prefixes to look for vLLM's metadata in: the interpreter's, then the executable's (bin/..)."""
    prefixes: List[str] = []
    interpreter = _interpreter(executable)
    for path in ([interpreter] if interpreter else []) + [executable, os.path.realpath(executable)]:
        prefix = os.path.dirname(os.path.dirname(os.path.abspath(path)))
        if prefix not in prefixes:
            prefixes.append(prefix)
    return prefixes


def _metadata_version(path: str) -> Optional[str]:
    """The Version: header of a METADATA file, or None."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if not line.strip():
                    break  # the headers end at the first empty line
                if line.lower().startswith("version:"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        return None
    return None


def _from_metadata(executable: str) -> Optional[VersionRead]:
    for prefix in _prefixes(executable):
        for pattern in ("lib*/python3*/site-packages", "lib*/python3*/dist-packages"):
            for path in sorted(glob.glob(os.path.join(prefix, pattern, "vllm-*.dist-info", "METADATA"))):
                version = _metadata_version(path)
                if version:
                    return {"version": version, "source": path, "error": None}
    return None


def _from_command(executable: str, timeout: float) -> VersionRead:
    command = "%s --version" % executable
    # Not AnsibleModule.run_command: it has no timeout, and a vLLM that hangs at import must not hang the play.
    try:
        done = subprocess.run(  # pylint: disable=ansible-bad-function
            [executable, "--version"], stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return {"version": None, "source": None, "error": "%s did not answer within %g s" % (command, timeout)}
    except OSError as error:
        return {"version": None, "source": None, "error": "%s failed: %s" % (command, error)}
    lines = done.stdout.decode("utf-8", "replace").split("\n")
    versions = [line.strip() for line in lines if parse(line.strip()) and " " not in line.strip()]
    if done.returncode != 0 or not versions:
        last = (done.stderr or done.stdout).decode("utf-8", "replace").strip().splitlines()
        return {
            "version": None,
            "source": None,
            "error": "%s exited %d%s"
            % (command, done.returncode, ": %s" % last[-1] if last else " and printed nothing"),
        }
    return {"version": versions[-1], "source": command, "error": None}


def read_version(executable: str, timeout: float = VERSION_TIMEOUT) -> VersionRead:
    """{"version": text or None, "source": the METADATA file or the command, "error": why none, or None}."""
    if not (os.path.isfile(executable) and os.access(executable, os.X_OK)):
        return {"version": None, "source": None, "error": "%s is not an executable file" % executable}
    found = _from_metadata(executable)
    if found is None:
        found = _from_command(executable, timeout)
        if found["error"]:
            found["error"] += "; and no vllm-*.dist-info/METADATA was found in %s" % " or ".join(_prefixes(executable))
    return found
