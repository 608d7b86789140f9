# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""_options.check_numbers: times (s) and sizes (MiB) must be finite and not negative, some greater than 0."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _select


def test_valid_values_and_omitted_options_pass():
    assert (
        _options.check_numbers(
            positive=("driver_timeout",),
            grace_period=0,
            kill_wait=5.0,
            timeout=0.0,
            max_used_mib=256,
            driver_timeout=0.001,
            poll_interval=None,
        )
        is None
    )


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_values_are_refused(value):
    with pytest.raises(_options.OptionError) as info:
        _options.check_numbers(grace_period=value)
    assert str(info.value) == "invalid option value: grace_period=%s (must be a finite number)" % value


@pytest.mark.parametrize("value", [-1, -0.5, -1e-9])
def test_negative_values_are_refused(value):
    with pytest.raises(_options.OptionError, match=r"kill_wait=%s \(must not be negative\)" % value):
        _options.check_numbers(kill_wait=value)


@pytest.mark.parametrize("value", [0, 0.0, -2.0])
def test_positive_names_refuse_zero_and_below(value):
    with pytest.raises(_options.OptionError, match=r"driver_timeout=%s \(must be greater than 0\)" % value):
        _options.check_numbers(positive=("driver_timeout",), driver_timeout=value)
    # The same value is fine for a name that only must not be negative (zero), or refused as negative.
    if value == 0:
        _options.check_numbers(positive=("driver_timeout",), timeout=value)


def test_every_bad_value_is_named_sorted_by_name():
    with pytest.raises(_options.OptionError) as info:
        _options.check_numbers(
            positive=("driver_timeout",), timeout=-1.0, grace_period=2, kill_wait=float("nan"), driver_timeout=0
        )
    assert str(info.value) == (
        "invalid option value: driver_timeout=0 (must be greater than 0); "
        "kill_wait=nan (must be a finite number); timeout=-1.0 (must not be negative)"
    )


def test_option_errors_are_value_errors_and_selection_errors_are_option_errors():
    # gpu_kill catches ValueError (unknown signals too), gpu_wait catches OptionError: both see selection errors.
    assert issubclass(_options.OptionError, ValueError)
    assert issubclass(_select.SelectionError, _options.OptionError)


@pytest.mark.parametrize("name", sorted(_options.MAX_SECONDS))
def test_a_time_above_its_bound_is_refused_naming_the_bound(name):
    # Issue 33 item 11: 1e308 s is finite, and a run given it prints nothing for hours.
    bound = _options.MAX_SECONDS[name]
    assert _options.check_numbers(at_most=_options.MAX_SECONDS, **{name: bound}) is None
    for value in (bound + 0.5, 1e308):
        with pytest.raises(_options.OptionError) as info:
            _options.check_numbers(at_most=_options.MAX_SECONDS, **{name: value})
        assert str(info.value) == "invalid option value: %s=%s (must be at most %s seconds)" % (name, value, bound)


def test_bounds_apply_only_where_given():
    # Sizes (max_used_mib) and the options of modules that pass no bound are not bounded here.
    assert _options.check_numbers(timeout=1e308, max_used_mib=10**9) is None
    assert "max_used_mib" not in _options.MAX_SECONDS
