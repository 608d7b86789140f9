# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The files of one vllm_server instance: compared with what is on disk, and written atomically.

files_of(params) -> [File]; File.differs(); write(file, set_owner) writes one. state(path) and differs(state, content,
mode) are the one comparison: the module compares on the host, the role's plan on the controller with the states
that vllm_server_host read.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from typing import Any, Callable, Dict, Mapping, TypedDict

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _outcome

KEY_MODE = 0o600
# <name>.json holds the instance's environment, where an operator may put a secret (HF_TOKEN): root's alone.
CONFIG_MODE = 0o600
FILE_MODE = 0o644


class FileState(TypedDict):
    """What a file is now (state): its content's SHA-256 (hex) and its mode."""

    sha256: str
    mode: int


class Diff(TypedDict):
    """Ansible's diff shape for one file."""

    before_header: str
    after_header: str
    before: str
    after: str


def key_text(api_key: str | None) -> str | None:
    """<name>.env as the role writes it, or None for no API key."""
    return ("VLLM_API_KEY=%s\n" % api_key) if api_key else None


def digest(text: str) -> str:
    """The SHA-256 of `text` (UTF-8), in hex."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def state(path: str) -> FileState | None:
    """What a file is now: None when it does not exist, else {"sha256", "mode"} (its content's SHA-256, its mode)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        mode = os.stat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None
    return {"sha256": hashlib.sha256(data).hexdigest(), "mode": mode}


def differs(found: FileState | None, content: str | None, mode: int) -> bool:
    """Whether a file in state `found` (see state()) must be written (or removed) to hold `content` with `mode`.
    The owner is not compared: it follows the configuration's user, whose change is a configuration change."""
    if found is None or content is None:
        return (found is None) != (content is None)
    return found["sha256"] != digest(content) or found["mode"] != mode


class File:
    """One file of an instance: `what` (its name in results), `path`, `content` (None: the file must not exist),
    `mode`, `owner` (None: as it is), `secret` (never shown in a diff)."""

    def __init__(
        self,
        what: str,
        path: str,
        content: str | None,
        mode: int = FILE_MODE,
        owner: str | None = None,
        secret: bool = False,
    ) -> None:
        self.what, self.path, self.content, self.mode, self.owner, self.secret = (
            what,
            path,
            content,
            mode,
            owner,
            secret,
        )

    def current(self) -> str | None:
        """The file's content now, or None when it does not exist."""
        try:
            with open(self.path, "rb") as handle:
                return handle.read().decode("utf-8", "replace")
        except FileNotFoundError:
            return None

    def differs(self) -> bool:
        """Whether the file must be written (or removed): see the module function differs()."""
        return differs(state(self.path), self.content, self.mode)

    def diff(self) -> Diff:
        """Ansible's diff shape for this file; a secret's content is not shown."""
        before, after = self.current(), self.content
        if self.secret:
            before = None if before is None else "(secret)\n"
            after = None if after is None else "(secret, changed)\n"
        return {"before_header": self.path, "after_header": self.path, "before": before or "", "after": after or ""}


def config_text(config: Mapping[str, Any]) -> str:
    """<name>.json as the role writes it: JSON, 2-space indent, sorted keys (as Ansible's to_nice_json)."""
    return json.dumps(config, indent=2, sort_keys=True, separators=(",", ": ")) + "\n"


def files_of(params: Mapping[str, Any]) -> list[File]:
    """The files of the instance in the vllm_server_files parameters `params`."""
    name, config_dir = params["name"], params["config_dir"]
    files = [
        File("configuration", os.path.join(config_dir, "%s.json" % name), config_text(params["config"]), CONFIG_MODE)
    ]
    files.append(
        File(
            "API key",
            os.path.join(config_dir, "%s.env" % name),
            key_text(params["api_key"]),
            KEY_MODE,
            params["owner"],
            secret=True,
        )
    )
    if params["unit_file"]:
        files.append(File("systemd unit", params["unit_file"], params["unit"]))
    return files


def write(file: File, set_owner: Callable[[str, str], object]) -> None:
    """Write (or remove) `file` atomically: a temporary file in its directory, then rename. `set_owner(path, owner)`
    gives it its owner before the rename."""
    if file.content is None:
        try:
            os.unlink(file.path)
        except FileNotFoundError:
            pass
        return
    directory = os.path.dirname(file.path) or "."
    handle, temporary = tempfile.mkstemp(prefix=".%s." % os.path.basename(file.path), dir=directory)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(file.content.encode("utf-8"))
        os.chmod(temporary, file.mode)
        if file.owner:
            set_owner(temporary, file.owner)
        os.rename(temporary, file.path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise


def argument_spec() -> Dict[str, Any]:
    """vllm_server_files' argument spec."""
    return dict(
        name=dict(type="str", required=True),
        config=dict(type="dict", required=True),
        config_dir=dict(type="path", required=True),
        api_key=dict(type="str", default="", no_log=True),
        owner=dict(type="str"),
        unit_file=dict(type="path"),
        unit=dict(type="str"),
    )


def run(
    params: Mapping[str, Any], check_mode: bool, diff: bool, set_owner: Callable[[str, str], object]
) -> _outcome.Outcome:
    """One run of vllm_server_files: the files that differ, written (not in check mode), with their diff when asked."""
    differing = [file for file in files_of(params) if file.differs()]
    result: Dict[str, Any] = {"changed": bool(differing), "changed_files": [file.what for file in differing]}
    if diff and differing:
        result["diff"] = [file.diff() for file in differing]
    if not check_mode:
        try:
            for file in differing:
                write(file, set_owner)
        except OSError as exc:
            msg = "cannot write the files of instance %s: %s" % (params["name"], exc)
            return _outcome.Outcome(dict(msg=msg, **result), failed=True)
    return _outcome.Outcome(result)
