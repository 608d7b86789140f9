# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One check for the numeric options of every module: times in seconds and sizes in MiB.

Ansible's `type: float` accepts "nan" and "inf" (Python's float() does): a grace period of nan
never ends, a timeout of inf never returns. Every module refuses them, and negative values, with
this helper before it signals or waits for anything.
"""

from __future__ import annotations

import math


class OptionError(ValueError):
    """An option value that the module refuses before doing anything."""


def check_numbers(positive=(), **values):
    """Raise OptionError naming every value that is not a finite number >= 0 (> 0 for names in `positive`).

    None values (options not given) are skipped. Returns nothing.
    """
    bad = []
    for name, value in sorted(values.items()):
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            bad.append("%s=%s (must be a finite number)" % (name, value))
        elif name in positive and value <= 0:
            bad.append("%s=%s (must be greater than 0)" % (name, value))
        elif value < 0:
            bad.append("%s=%s (must not be negative)" % (name, value))
    if bad:
        raise OptionError("invalid option value: %s" % "; ".join(bad))
