# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one number converter of plugin_utils/_numbers.py, as the reset, check and vllm_server variables use it."""

from __future__ import annotations

import math

import pytest

from ansible_collections.gpuops.nvidia.plugins.plugin_utils._numbers import Refused, number, number_or_none


@pytest.mark.parametrize(
    "value, whole, expected",
    [(3, False, 3), (2.5, False, 2.5), ("4", False, 4), (" 2.5 ", False, 2.5), ("7", True, 7), (3.0, True, 3)],
)
def test_a_number_is_read_as_given(value, whole, expected):
    found = number("x", value, whole)
    assert found == expected and type(found) is type(expected)
    assert number_or_none(value, whole) == expected


@pytest.mark.parametrize(
    "value, whole, message",
    [
        (True, False, "x must be a number, not true"),
        (None, True, "x must be a whole number, not null"),
        ("abc", False, "x must be a number, not 'abc'"),
        ("2.5", True, "x must be a whole number, not '2.5'"),
        (2.5, True, "x must be a whole number, not 2.5"),
        (math.inf, True, "x must be a whole number, not inf"),
        ([1], False, "x must be a number, not [1]"),
    ],
)
def test_what_is_no_number_is_refused_by_name(value, whole, message):
    with pytest.raises(Refused) as refused:
        number("x", value, whole)
    assert str(refused.value) == message
    assert number_or_none(value, whole) is None


def test_a_float_that_is_not_whole_stays_a_float_where_a_fraction_is_fine():
    assert number_or_none(math.inf) == math.inf
