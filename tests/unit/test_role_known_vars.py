# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The variables the reset_gpus role and check_gpus.yml know (plugins/filter/inputs.py) are the ones they document
and use: the role's argument spec, its defaults; the playbook's header."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from ansible_collections.gpuops.nvidia.plugins.filter import inputs

REPO = Path(__file__).resolve().parents[2]
ROLE = REPO / "roles" / "reset_gpus"


def test_the_role_knows_exactly_its_options_and_each_default_is_one():
    spec = ROLE / "meta" / "argument_specs.yml"
    options = yaml.safe_load(spec.read_text())["argument_specs"]["main"]["options"]
    assert set(inputs.spec_options(str(spec))) == set(options)
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    assert set(defaults) <= set(options), sorted(set(defaults) - set(options))
    # The selection has no default: unset means any, and null given is refused.
    assert not {"reset_gpus_" + kind for kind in inputs.SELECTIONS} & set(defaults)
    assert {"reset_gpus_" + kind for kind in inputs.SELECTIONS} <= set(options)
    # Every other option has its default in defaults/main.yml, with the same value as the spec says.
    for name, option in options.items():
        if "default" in option:
            assert defaults[name] == option["default"], name


def test_check_gpus_knows_the_variables_its_header_names():
    text = (REPO / "playbooks" / "check_gpus.yml").read_text()
    header = text.split("\n- name:", 1)[0]
    named = set(re.findall(r"\bcheck_gpus_[a-z_]+[a-z]", header))
    assert named == set(inputs.CHECK_GPUS_KNOWN), sorted(named ^ set(inputs.CHECK_GPUS_KNOWN))
