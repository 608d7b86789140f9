# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/module_utils/vllm/_vllm_files.py: an instance's files compared and written."""

from __future__ import annotations

import json
import os

from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_files

SECRET = "sk-never-in-a-diff-4711"


def params(tmp_path, **extra):
    return dict(
        {
            "name": "a",
            "config_dir": str(tmp_path),
            "config": {"port": 8000, "name": "a"},
            "api_key": SECRET,
            "owner": None,
            "unit_file": None,
            "unit": None,
        },
        **extra,
    )


def write_all(files):
    for file in files:
        _vllm_files.write(file, lambda path, owner: None)


def test_files_are_written_then_equal(tmp_path):
    files = _vllm_files.files_of(params(tmp_path, unit_file=str(tmp_path / "vllm-a.service"), unit="[Unit]\n"))
    assert [f.what for f in files if f.differs()] == ["configuration", "API key", "systemd unit"]
    write_all(files)
    assert not [
        f
        for f in _vllm_files.files_of(params(tmp_path, unit_file=str(tmp_path / "vllm-a.service"), unit="[Unit]\n"))
        if f.differs()
    ]
    text = (tmp_path / "a.json").read_text()
    assert text == '{\n  "name": "a",\n  "port": 8000\n}\n' and json.loads(text) == {"name": "a", "port": 8000}
    assert (tmp_path / "a.env").read_text() == "VLLM_API_KEY=%s\n" % SECRET
    assert (
        os.stat(tmp_path / "a.env").st_mode & 0o777 == 0o600 and os.stat(tmp_path / "a.json").st_mode & 0o777 == 0o600
    )
    assert sorted(os.listdir(tmp_path)) == ["a.env", "a.json", "vllm-a.service"]  # no temporary file is left


def test_a_changed_mode_or_value_differs_and_the_key_never_shows(tmp_path):
    write_all(_vllm_files.files_of(params(tmp_path)))
    os.chmod(tmp_path / "a.env", 0o644)
    changed = [
        f
        for f in _vllm_files.files_of(params(tmp_path, config={"name": "a", "port": 8001}, api_key="sk-new"))
        if f.differs()
    ]
    assert [f.what for f in changed] == ["configuration", "API key"]
    diffs = [f.diff() for f in changed]
    assert '"port": 8000' in diffs[0]["before"] and '"port": 8001' in diffs[0]["after"]
    assert SECRET not in json.dumps(diffs) and "sk-new" not in json.dumps(diffs)


def test_no_api_key_removes_the_file(tmp_path):
    write_all(_vllm_files.files_of(params(tmp_path)))
    files = _vllm_files.files_of(params(tmp_path, api_key=""))
    assert [f.what for f in files if f.differs()] == ["API key"]
    write_all(f for f in files if f.differs())
    assert not (tmp_path / "a.env").exists()
    assert not [f for f in _vllm_files.files_of(params(tmp_path, api_key="")) if f.differs()]


def test_a_configuration_readable_by_every_user_is_written_again_for_root_alone(tmp_path):
    # The configuration holds the instance's environment (an HF_TOKEN, say): 0644 from an earlier write differs.
    files = _vllm_files.files_of(params(tmp_path, config={"name": "a", "environment": {"HF_TOKEN": "hf_x"}}))
    write_all(files)
    os.chmod(tmp_path / "a.json", 0o644)
    changed = [
        f
        for f in _vllm_files.files_of(params(tmp_path, config={"name": "a", "environment": {"HF_TOKEN": "hf_x"}}))
        if f.differs()
    ]
    assert [f.what for f in changed] == ["configuration"]
    write_all(changed)
    assert os.stat(tmp_path / "a.json").st_mode & 0o777 == 0o600
