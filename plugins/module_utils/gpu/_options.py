# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One check for the numeric options of every module: times in seconds and sizes in MiB.

Ansible's `type: float` accepts "nan" and "inf" (Python's float() does): a grace period of nan
never ends, a timeout of inf never returns. Every module refuses them, and negative values, with
this helper before it signals or waits for anything. A finite time can still be too long to be
meant (1e308 s): the times of gpu_kill and gpu_wait have an upper bound, MAX_SECONDS.
"""

from __future__ import annotations

import math
from typing import Any, Collection, Mapping, Optional, Union

# An option's value as the modules receive it (type int or float), or None when it is not given.
Number = Union[int, float, None]


# The longest time, in seconds, that each time option of gpu_kill and gpu_wait (and the role variables that set them)
# may ask for. A reset takes seconds; a value past these is a typo or a unit mix-up (ms for s), and would leave a run
# silent for hours. Each is well above what the thing it waits for takes on a real host:
MAX_SECONDS = {
    # vLLM's shutdown of a loaded server takes seconds; systemd waits 90 s (DefaultTimeoutStopSec) before SIGKILL.
    "grace_period": 3600,
    # After SIGKILL a process is gone within milliseconds, unless stuck in the driver (state D), which no wait ends.
    "kill_wait": 600,
    # The first nvmlInit with persistence mode off initializes every GPU: seconds (nvidia-container-toolkit#202).
    "driver_timeout": 600,
    # The driver frees a dead process's memory within about a second, pinned host memory within tens of seconds.
    "wait_timeout": 3600,
    "timeout": 3600,
    "poll_interval": 60,
    # How long gpu_kill waits for another gpu_kill run on the same host (itself bounded by the limits above).
    "lock_timeout": 3600,
}


class OptionError(ValueError):
    """An option value that the module refuses before doing anything."""


def check_numbers(
    positive: Collection[str] = (), at_most: Optional[Mapping[str, float]] = None, **values: Number
) -> None:
    """Raise OptionError naming every value that is not a finite number >= 0 (> 0 for names in `positive`), or
    that is above its bound in `at_most` ({name: the largest value, in seconds}).

    None values (options not given) are skipped. Returns nothing.
    """
    at_most = at_most or {}
    bad: list[str] = []
    for name, value in sorted(values.items()):
        if value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            bad.append("%s=%s (must be a finite number)" % (name, value))
        elif name in positive and value <= 0:
            bad.append("%s=%s (must be greater than 0)" % (name, value))
        elif value < 0:
            bad.append("%s=%s (must not be negative)" % (name, value))
        elif name in at_most and value > at_most[name]:
            bad.append("%s=%s (must be at most %s seconds)" % (name, value, at_most[name]))
    if bad:
        raise OptionError("invalid option value: %s" % "; ".join(bad))


def refuse_bad_numbers(
    module: Any,
    names: Collection[str],
    positive: Collection[str] = (),
    at_most: Optional[Mapping[str, float]] = None,
    prefix: str = "",
) -> None:
    """The one numbers guard of the modules: module.fail_json(msg=prefix + why) when an option named in `names`
    (read from module.params) is not a finite number >= 0, > 0 for names in `positive`, at most at_most[name]
    (seconds). Returns nothing when every value is good."""
    try:
        check_numbers(positive=positive, at_most=at_most, **{name: module.params[name] for name in names})
    except OptionError as exc:
        module.fail_json(msg=prefix + str(exc))
