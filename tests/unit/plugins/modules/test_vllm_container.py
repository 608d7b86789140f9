# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vllm_container (issue 43) with a stand-in runtime on PATH: check mode calls nothing but inspect; a failure says
which command failed and what the runtime wrote."""

from __future__ import annotations

import json

from ansible_collections.gpuops.nvidia.plugins.modules import vllm_container
from module_main import run_main

RUNNING = [{"Id": "ab" * 32, "Image": "cd" * 32, "State": {"Running": True, "Pid": 77, "Status": "running"}}]


def stand_in(tmp_path, monkeypatch, inspect, run_rc=0):
    """`podman` on PATH: logs its arguments; `container inspect` prints `inspect` (exit 125 with "no such container"
    for None); `run` exits `run_rc`."""
    log = tmp_path / "calls"
    (tmp_path / "inspect.json").write_text(json.dumps(inspect) if inspect is not None else "")
    script = tmp_path / "podman"
    script.write_text(
        "#!/bin/sh\n"
        'echo "$@" >> %s\n'
        'case "$1 $2" in\n'
        '  "container inspect") [ -s %s ] || { echo "Error: no such container" >&2; exit 125; }; cat %s ;;\n'
        '  "run -d") echo "Error: image not known" >&2; exit %d ;;\n'
        "esac\n" % (log, tmp_path / "inspect.json", tmp_path / "inspect.json", run_rc)
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", "%s:/usr/bin:/bin" % tmp_path)
    return log


def test_check_mode_stops_and_starts_nothing(capsys, tmp_path, monkeypatch):
    log = stand_in(tmp_path, monkeypatch, RUNNING)
    args = {"runtime": "podman", "name": "vllm-qwen", "state": "absent", "_ansible_check_mode": True}
    code, result = run_main(vllm_container, capsys, args)
    assert code == 0 and result["changed"] is True and result["container"]["pid"] == 77
    args = dict(args, state="started", argv=["run", "-d", "img"])
    code, result = run_main(vllm_container, capsys, args)
    assert code == 0 and result["changed"] is False  # it runs already
    assert log.read_text().splitlines() == ["container inspect vllm-qwen"] * 2


def test_absent_when_there_is_none_changes_nothing(capsys, tmp_path, monkeypatch):
    log = stand_in(tmp_path, monkeypatch, None)
    code, result = run_main(vllm_container, capsys, {"runtime": "podman", "name": "vllm-qwen", "state": "absent"})
    assert (code, result["changed"], result["container"]) == (0, False, None)
    assert log.read_text().splitlines() == ["container inspect vllm-qwen"]


def test_a_failed_run_says_which_command_and_what_the_runtime_wrote(capsys, tmp_path, monkeypatch):
    stand_in(tmp_path, monkeypatch, None, run_rc=125)
    args = {"runtime": "podman", "name": "vllm-qwen", "argv": ["run", "-d", "--name", "vllm-qwen", "img"]}
    code, result = run_main(vllm_container, capsys, args)
    assert code == 1 and result["msg"] == "podman run -d --name vllm-qwen img failed (rc 125): Error: image not known"
