# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The operator's number variables, checked on the controller before anything runs: one check for the reset_gpus
role, check_gpus.yml (plugins/filter/inputs.py) and the vllm_server role (plugins/plugin_utils/_vllm_checks.py).

numbers(given, positive, whole, at_most, **defaults) -> {name: number}, or Refused naming each bad one as given.
number(name, value, whole) -> one number variable as given (int or float), or Refused: the one converter.
number_or_none(value, whole) -> the same number, or None where `number` refuses it (the vllm_server checks).
shown(value) -> a value as the operator wrote it, for a message: null, true, false, never None.
"""

from __future__ import annotations

from typing import Any, Collection, Dict, Mapping, Optional, Union

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options

Number = Union[int, float]


class Refused(ValueError):
    """A variable that is refused before anything is signalled or checked; the message names it."""


def shown(value: object) -> str:
    """`value` in a message as YAML says it (null, true, false), text quoted: [0, null], not [0, None]."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[%s]" % ", ".join(shown(item) for item in value)
    if isinstance(value, dict):
        return "{%s}" % ", ".join("%s: %s" % (shown(key), shown(item)) for key, item in value.items())
    return repr(value)


def number(name: str, value: object, whole: bool = False) -> Number:
    """A number variable as given: numeric text ("-1", "2.5") becomes int or float, so a message prints it as given.
    Refused (naming `name`) for a boolean, null, text that is no number, anything else that is not an int or a
    float, and, when `whole`, a float that is not whole (inf and nan too)."""
    kind = "whole number" if whole else "number"
    if isinstance(value, bool) or value is None:
        raise Refused("%s must be a %s, not %s" % (name, kind, shown(value)))
    if isinstance(value, str):
        for convert in (int,) if whole else (int, float):
            try:
                return convert(value.strip())
            except ValueError:
                pass
        raise Refused("%s must be a %s, not %s" % (name, kind, shown(value)))
    if not isinstance(value, (int, float)):
        raise Refused("%s must be a %s, not %s" % (name, kind, shown(value)))
    if whole and isinstance(value, float) and not value.is_integer():
        raise Refused("%s must be a whole number, not %s" % (name, shown(value)))
    return int(value) if whole else value


def number_or_none(value: object, whole: bool = False) -> Optional[Number]:
    """`number` for a check that words its own problem: the number in `value`, or None where `number` refuses it."""
    try:
        return number("", value, whole)
    except Refused:
        return None


def numbers(
    given: Mapping[str, Any],
    positive: Collection[str] = (),
    whole: Collection[str] = (),
    at_most: Optional[Mapping[str, float]] = None,
    **defaults: Any,
) -> Dict[str, Number]:
    """{name: number} of the number variables named in `defaults` (given[name], else the default), checked: finite,
    not negative, > 0 for names in `positive`, whole for names in `whole`, at most at_most[name] (seconds) for the
    names there; Refused names each bad one as given."""
    values = {name: number(name, given.get(name, default), name in whole) for name, default in defaults.items()}
    try:
        _options.check_numbers(positive=positive, at_most=at_most, **values)
    except _options.OptionError as exc:
        raise Refused(str(exc).replace("invalid option value: ", "invalid value: "))
    return values
