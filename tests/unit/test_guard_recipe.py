# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""docs/guard.md's node_exporter and Prometheus recipe works when copied (issue 46 item 8): the node_exporter flags it
gives are flags of the Debian binary that `make setup` installs, and its prometheus.yml, beside the shipped rules,
passes `promtool check config`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
GUARD = REPO / "docs" / "guard.md"
RULES = REPO / "extensions" / "prometheus" / "gpuops_nvidia_guard.rules.yml"
NODE_EXPORTER = "prometheus-node-exporter"


def tool(name):
    path = shutil.which(name)
    if not path:
        pytest.fail(
            "%s is missing: scripts/setup.sh installs it (Debian packages prometheus, prometheus-node-exporter)" % name
        )
    return path


def recipe():
    text = GUARD.read_text()
    start = text.index("### node_exporter and Prometheus: a recipe")
    return text[start : text.index("\n### ", text.index("### A textfile directory on a shared filesystem"))]


def test_the_node_exporter_flags_of_the_recipe_are_the_binary_s():
    commands = re.findall(r"^    node_exporter (.*)$", recipe(), re.M)
    assert len(commands) >= 2, recipe()
    given = {flag for command in commands for flag in re.findall(r"(--[a-z.-]+)", command)}
    assert "--collector.textfile.directory" in given, commands
    usage = subprocess.run([tool(NODE_EXPORTER), "--help"], capture_output=True, text=True, timeout=30, check=False)
    known = set(re.findall(r"(--[a-z][a-z.-]*)", usage.stdout + usage.stderr))
    assert given <= known, sorted(given - known)


def test_the_prometheus_yml_of_the_recipe_passes_promtool(tmp_path):
    blocks = re.findall(r"```yaml\n(# prometheus\.yml\n.*?)```", recipe(), re.S)
    assert len(blocks) == 1, recipe()
    config = yaml.safe_load(blocks[0])
    assert config["rule_files"] == [RULES.name] and config["alerting"]["alertmanagers"], config
    assert [job["job_name"] for job in config["scrape_configs"]] == ["node"], config
    (tmp_path / "prometheus.yml").write_text(blocks[0])
    shutil.copy(RULES, tmp_path / RULES.name)
    check = subprocess.run(
        [tool("promtool"), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 1 rule files found" in check.stdout + check.stderr, check.stdout + check.stderr
