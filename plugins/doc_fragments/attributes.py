# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
from __future__ import annotations


class ModuleDocFragment:
    """Shared `attributes` documentation for the collection's modules."""

    # Standard documentation fragment
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    description: Can run in C(check_mode) and return changed status prediction without modifying target.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in C(check_mode)), when in diff mode.
"""

    # With the standard fragment: full check mode (the module's own check_mode details say what it does there).
    FULL_CHECK = r"""
options: {}
attributes:
  check_mode:
    support: full
"""

    # With the standard fragment: a module that acts on the host, with full check mode and no diff.
    NO_DIFF = r"""
options: {}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
"""

    # Should be used together with the standard fragment
    INFO_MODULE = r"""
options: {}
attributes:
  check_mode:
    support: full
    details:
      - This action does not modify state.
  diff_mode:
    support: N/A
    details:
      - This action does not modify state.
"""

    FACTS = r"""
options: {}
attributes:
  facts:
    description: Action returns an C(ansible_facts) dictionary that will update existing host facts.
"""

    # Should be used together with the standard, INFO_MODULE and FACTS fragments (fragments' attributes merge)
    FACTS_MODULE = r"""
options: {}
attributes:
  facts:
    support: full
"""
