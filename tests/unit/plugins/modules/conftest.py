# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Every module test gets its own warning lists (autouse fixture `own_warnings`)."""

from __future__ import annotations

import pytest
from ansible.module_utils import _internal as ansible_internal
from ansible.module_utils.common import warnings as ansible_warnings


@pytest.fixture(autouse=True)
def own_warnings(monkeypatch):
    """AnsibleModule.warn collects into process-wide dicts that exit_json does not empty: give each test its own,
    so that one module's warnings neither leak into another's tests nor come from them."""
    # Where a test in the same run imported controller code (an action plugin), ansible-core >= 2.19 marks the
    # process as the controller and sends module warnings to Display: the module runs here as on a host.
    if hasattr(ansible_internal, "is_controller"):
        monkeypatch.setattr(ansible_internal, "is_controller", False)
    monkeypatch.setattr(ansible_warnings, "_global_warnings", {})
    monkeypatch.setattr(ansible_warnings, "_global_deprecations", {})
