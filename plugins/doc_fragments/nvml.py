# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """What the modules that read the NVIDIA driver need on the host (checked by _gpus.check_libraries)."""

    DOCUMENTATION = r"""
options: {}
requirements:
  - nvidia-ml-py >= 12.535.108 (module C(pynvml); older releases misread the process lists) and psutil on the managed host
"""
