# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every test file has a basename of its own: pytest imports test modules by basename (rootdir-relative, no packages),
so a second test_x.py is an "import file mismatch" error and the other file's tests do not run."""

from __future__ import annotations

import collections
import pathlib

TESTS = pathlib.Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_basename():
    seen = collections.defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if ".venv" not in path.parts and "output" not in path.parts:
            seen[path.name].append(str(path.relative_to(TESTS)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
