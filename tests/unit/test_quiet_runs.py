# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The project's venvs run quietly (issue 46 item 10): a plain playbook run from .venv prints no
CryptographyDeprecationWarning (ansible-core's SSH agent client imports cryptography's DSA classes; requirements-dev.txt
pins a cryptography that does not deprecate them), and ansible-rulebook in .venv-eda does not log that ansible-core is
missing (requirements-eda.txt). Both are what `make setup` installs: nothing hides a warning."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run(argv, cwd):
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHONWARNINGS", "ANSIBLE_"))}
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False)
    return result.returncode, result.stdout + result.stderr


def test_a_plain_playbook_run_prints_no_warning(tmp_path):
    play = tmp_path / "quiet.yml"
    play.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n    - ansible.builtin.debug:\n        msg: quiet\n")
    rc, out = run(
        [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", "localhost,", "-c", "local", str(play)], REPO
    )
    assert rc == 0 and '"msg": "quiet"' in out, out
    assert "Warning" not in out and "WARNING" not in out, out


def test_ansible_rulebook_finds_its_ansible_core(tmp_path):
    rc, out = run([str(REPO / ".venv-eda" / "bin" / "ansible-rulebook"), "--version"], tmp_path)
    assert rc == 0 and "ansible-rulebook [" in out, out
    assert "is not installed" not in out and "Ansible core version = unknown" not in out, out
