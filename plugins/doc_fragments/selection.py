# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """The selection options that gpu_kill and gpu_wait word alike (argument spec: _select.HOLDER_ARGS)."""

    DOCUMENTATION = r"""
options:
  pid_start_ticks:
    description:
      - Pins PIDs of O(pids) to processes, as a mapping of each PID to its start ticks (the start time in clock ticks since boot,
        field 22 of C(/proc/PID/stat); the label C(start_ticks) of M(gpuops.nvidia.gpu_guard)'s orphan metric).
        A listed PID whose process started at another time (the PID was reused) is left alone, with the reason.
      - Every key must be one of O(pids); each value a whole number. Omitted, no PID is pinned.
    type: dict
"""
