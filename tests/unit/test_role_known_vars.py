# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""reset_gpus finds the variables it knows in the text of meta/argument_specs.yml with a regular expression (cheaper
on every host than parsing the YAML): that expression must find exactly the options."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROLE = Path(__file__).resolve().parents[2] / "roles" / "reset_gpus"


def test_the_known_variables_expression_finds_exactly_the_options():
    role_vars = (ROLE / "vars" / "main.yml").read_text()
    (pattern,) = re.findall(r"regex_findall\('([^']+)'\)", role_vars)
    spec_text = (ROLE / "meta" / "argument_specs.yml").read_text()
    options = yaml.safe_load(spec_text)["argument_specs"]["main"]["options"]
    found = re.findall(pattern, spec_text)
    assert len(found) == len(set(found)) and set(found) == set(options), (sorted(found), sorted(options))
    # The expression is not trivially true: an option named at another indentation would not count.
    assert "reset_gpus_gpus" not in re.findall(pattern, spec_text.replace("\n      reset_gpus_gpus:", "\n        reset_gpus_gpus:"))
