# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The number options of every module, written once, and their one check: times in seconds and sizes in MiB.

Each module family has one table of its number options (type, default, above 0 or not, largest value, one line of
text): GPU for the GPU modules and the roles and playbooks that set them, DRAIN, READY and DETACHED for a vLLM server.
The modules' argument specs (`spec`), their checks (`check`), gpu_wait's action plugin and the role filters' defaults
(`role_defaults`, plugins/filter/inputs.py) are built from them. The modules' DOCUMENTATION and the roles'
meta/argument_specs.yml and defaults/main.yml say the same defaults:
tests/unit/plugins/module_utils/test_option_table.py fails where one differs, and where a default is written again.

Ansible's `type: float` accepts "nan" and "inf" (Python's float() does): a grace period of nan
never ends, a timeout of inf never returns. Every module refuses them, and negative values, with
this helper before it signals or waits for anything. A finite time can still be too long to be
meant (1e308 s): the times of gpu_kill and gpu_wait have an upper bound, MAX_SECONDS.
"""

from __future__ import annotations

import math
from typing import Any, Collection, Dict, Mapping, NamedTuple, Optional, Tuple, Union

# An option's value as the modules receive it (type int or float), or None when it is not given.
Number = Union[int, float, None]


class Option(NamedTuple):
    """A number option: its argument spec type ("float": seconds, "int": MiB), its default, one line of text, whether
    it must be above 0, and its largest value (None: no bound)."""

    type: str
    default: Union[int, float]
    text: str
    positive: bool = False
    at_most: Optional[float] = None


# The GPU modules' number options (gpu_facts, gpu_kill, gpu_wait, gpu_guard, gpu_reset, vllm_server_host). The largest
# times: a reset takes seconds; a value past these is a typo or a unit mix-up (ms for s), and would leave a run silent
# for hours. Each is well above what the thing it waits for takes on a real host.
GPU: Dict[str, Option] = {
    # vLLM's shutdown of a loaded server takes seconds; systemd waits 90 s (DefaultTimeoutStopSec) before SIGKILL.
    "grace_period": Option("float", 10.0, "seconds from the first signal to SIGKILL", at_most=3600),
    # After SIGKILL a process is gone within milliseconds, unless stuck in the driver (state D), which no wait ends.
    "kill_wait": Option("float", 5.0, "seconds to wait for an exit after SIGKILL", at_most=600),
    # The first nvmlInit with persistence mode off initializes every GPU: seconds (nvidia-container-toolkit#202).
    "driver_timeout": Option("float", 10.0, "seconds the NVIDIA driver may take to answer", positive=True, at_most=600),
    # The driver frees a dead process's memory within about a second, pinned host memory within tens of seconds.
    "wait_timeout": Option("float", 60.0, "gpu_kill wait=true: seconds to wait for the release", at_most=3600),
    "timeout": Option("float", 60.0, "gpu_wait: seconds to wait for the release", at_most=3600),
    # A look costs a few ms on a node with a few hundred processes.
    "poll_interval": Option("float", 0.02, "seconds between two looks", at_most=60),
    # How long gpu_kill waits for another gpu_kill run on the same host (itself bounded by the limits above).
    "lock_timeout": Option("float", 120.0, "seconds gpu_kill waits for another run on the host", at_most=3600),
    # NVML v2 `used` excludes reserved memory, so an idle GPU reports a few MiB; no CUDA context is as small as 256 MiB.
    "max_used_mib": Option("int", 256, "used MiB per GPU that counts as released"),
    # gpu_wait's slices (its action plugin): one line of progress an hour at least.
    "progress_interval": Option("float", 0.0, "gpu_wait: seconds of one slice of the wait, 0 for one", at_most=3600),
    # gpu_reset: `nvidia-smi --gpu-reset` of a GPU takes seconds; the other commands (systemctl stop of a daemon that
    # saves its state, nvidia-smi -pm) up to a unit's stop timeout (systemd: 90 s by default).
    "reset_timeout": Option(
        "float", 60.0, "gpu_reset: seconds nvidia-smi --gpu-reset may take", positive=True, at_most=3600
    ),
    "command_timeout": Option(
        "float", 120.0, "gpu_reset: seconds each other command may take", positive=True, at_most=3600
    ),
}

# The longest time, in seconds, that each time option of the GPU modules (and the role variables that set them) may ask
# for.
MAX_SECONDS: Dict[str, float] = {name: option.at_most for name, option in GPU.items() if option.at_most is not None}

# The reset_gpus role's and check_gpus.yml's number variables: the GPU option each sets, and the variable's own default
# where it differs from the option's (a reset waits longer than gpu_wait; check_gpus looks and hardly waits; the first
# slice of a reset's wait is one progress interval).
ROLE_NUMBERS: Dict[str, Tuple[str, Optional[float]]] = {
    "reset_gpus_grace_period": ("grace_period", None),
    "reset_gpus_kill_wait": ("kill_wait", None),
    "reset_gpus_timeout": ("timeout", 120),
    "reset_gpus_max_used_mib": ("max_used_mib", None),
    "reset_gpus_driver_timeout": ("driver_timeout", None),
    "reset_gpus_progress_interval": ("wait_timeout", 15),
    "check_gpus_wait": ("timeout", 5),
    "check_gpus_max_used_mib": ("max_used_mib", None),
    "check_gpus_driver_timeout": ("driver_timeout", None),
    "reset_gpus_gpu_reset_timeout": ("reset_timeout", None),
}

# A vLLM server's drain and stop (vllm_drain; the vllm_server role's vllm_server_drain_timeout and
# vllm_server_stop_timeout), and a process started without a service manager (detached_process).
DRAIN: Dict[str, Option] = {
    "timeout": Option("float", 60.0, "seconds to wait for the running and waiting requests to end"),
    "poll_interval": Option("float", 1.0, "seconds between two readings of the gauges", positive=True),
    "request_timeout": Option("float", 10.0, "seconds one HTTP request may take in all"),
    "grace_period": Option("float", 60.0, "seconds from SIGTERM to SIGKILL"),
    "kill_wait": Option("float", 10.0, "seconds to wait for an exit after SIGKILL"),
}
# Waiting for a vLLM server to be ready (vllm_ready): a loaded model takes minutes.
READY: Dict[str, Option] = {
    "timeout": Option("float", 600.0, "seconds to wait for the server to be ready"),
    "poll_interval": Option("float", 2.0, "seconds between two looks"),
    "request_timeout": Option("float", 30.0, "seconds one HTTP request may take in all"),
    "completion_max_tokens": Option("int", 4, "tokens of the completion that proves the server answers"),
}
DETACHED: Dict[str, Option] = {
    "grace_period": Option("float", 30.0, "seconds from SIGTERM to SIGKILL"),
    "kill_wait": Option("float", 10.0, "seconds to wait for an exit after SIGKILL"),
}


def spec(table: Mapping[str, Option], *names: str) -> Dict[str, Dict[str, Any]]:
    """The argument spec entries of the options `names` of `table`: {name: {"type": ..., "default": ...}}."""
    return {name: {"type": table[name].type, "default": table[name].default} for name in names}


def default(name: str) -> Union[int, float]:
    """The default of the GPU option `name`."""
    return GPU[name].default


def role_defaults(*variables: str) -> Dict[str, Union[int, float]]:
    """{variable: its default} of reset_gpus or check_gpus number variables (ROLE_NUMBERS)."""
    found: Dict[str, Union[int, float]] = {}
    for variable in variables:
        option, own = ROLE_NUMBERS[variable]
        found[variable] = GPU[option].default if own is None else own
    return found


def bounds(table: Mapping[str, Option], names: Collection[str]) -> Dict[str, Any]:
    """refuse_bad_numbers' `positive` and `at_most` for the options `names` of `table`."""
    return {
        "positive": [name for name in names if table[name].positive],
        "at_most": {name: table[name].at_most for name in names if table[name].at_most is not None},
    }


def role_bounds(*variables: str) -> Dict[str, float]:
    """{variable: the largest value of the option it sets, seconds} of those variables whose option has one."""
    bounds = {variable: GPU[ROLE_NUMBERS[variable][0]].at_most for variable in variables}
    return {variable: bound for variable, bound in bounds.items() if bound is not None}


def check(table: Mapping[str, Option], params: Mapping[str, Any], names: Collection[str]) -> None:
    """check_numbers of the options `names` (read from params) with their table's bounds; raises OptionError."""
    check_numbers(**bounds(table, names), **{name: params[name] for name in names})


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
