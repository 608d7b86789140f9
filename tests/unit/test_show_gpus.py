# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""scripts/show_gpus.py (make demo's table of gpu_facts) never prints None."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("show_gpus", REPO / "scripts" / "show_gpus.py")
show_gpus = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(show_gpus)


def test_a_node_without_the_driver_library_reads_not_read_for_memory(capsys):
    # The GPUs known from /proc/driver/nvidia only: index and minor, no memory.
    gpu = {"index": 0, "minor": 0, "holder_pids": [], "memory_used_mib": None, "memory_total_mib": None}
    driver = {"driver_version": None, "error": "NVMLError_LibraryNotFound: NVML Shared Library Not Found"}
    facts = {"driver": driver, "holders": [], "gpus": [dict(gpu, memory_reserved_mib=None)]}
    show_gpus.show("node1", {"ansible_facts": {"nvidia": facts}})
    out = capsys.readouterr().out
    assert "None" not in out and "driver not available: NVMLError_LibraryNotFound" in out, out
    assert "    0      0  not read / not read   not read  -" in out.splitlines(), out
    # No version and no reason either: still no None.
    show_gpus.show("node1", {"ansible_facts": {"nvidia": dict(facts, driver={"driver_version": None, "error": None})}})
    out = capsys.readouterr().out
    assert "None" not in out and "driver not available: no error given" in out, out
