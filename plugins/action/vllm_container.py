# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""vllm_container runs with the Python of gpuops_nvidia_venv where it exists on the host (plugins/plugin_utils/_interpreter.py)."""

from __future__ import annotations

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._interpreter import ActionModule  # noqa: F401 pylint: disable=unused-import
