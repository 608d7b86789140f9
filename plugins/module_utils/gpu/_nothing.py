# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""A selection that names nothing: the one classification, for the modules (_select.check_not_empty), the
collection's action plugin (a null option: plugins/plugin_utils/_interpreter.py) and the variables of the role and
the playbooks (plugins/filter/inputs.py).

Imports nothing of the collection: the controller loads it for every task of a module of the collection and for
every host's check of the variables, where _select's imports (_owners, _proc) would cost a worker 16-40 ms.
"""

from __future__ import annotations

from typing import Dict, List, Literal, Mapping, Optional

# The owner filters among _select.HOLDER_ARGS (docs/owners.md): each selects holders whose owner block matches.
OWNER_FILTERS = ("units", "containers", "pods", "slurm_jobs")
# The options that select holders. Each one given must select something: see _select.check_not_empty.
SELECTION_OPTIONS = ("gpus", "pids", "match", "users") + OWNER_FILTERS

# How a value given for a selection option names nothing (names_nothing). "null", "empty" and "blank" are the whole
# value; "only blank entries" a list of nothing but null or blank entries; "a blank entry" a list with a null or blank
# entry beside real ones.
Nothing = Literal["null", "empty", "blank", "only blank entries", "a blank entry"]
# The words of check_not_empty's refusal for each kind that it refuses, several options at once.
_NOTHING_WORDS = {
    "null": "null",
    "empty": "empty",
    "blank": "blank",
    "only blank entries": "lists of nothing but null or blank entries",
}


def blank(value: object) -> bool:
    """True for a value that names nothing: null, or a string of whitespace only."""
    return value is None or (isinstance(value, str) and not value.strip())


def names_nothing(value: object) -> Optional[Nothing]:
    """How `value`, given for a selection option, names nothing, or None when it names something.

    The one classification of an empty selection: the modules (check_not_empty), the collection's action plugin (a
    null option, which only the controller sees: null_refusal) and the role's and playbooks' variables
    (plugins/filter/inputs.py) all ask it. Null, an empty or blank string, an empty list, a list of nothing but null
    or blank entries ("only blank entries"), a list with a null or blank entry beside real ones ("a blank entry").
    Anything else (a number, a mapping) is the option's own type check's to refuse.
    """
    if value is None:
        return "null"
    if isinstance(value, str):
        return "empty" if not value else "blank" if not value.strip() else None
    if isinstance(value, (list, tuple)):
        if not value:
            return "empty"
        blanks = sum(1 for item in value if blank(item))
        return None if not blanks else "only blank entries" if blanks == len(value) else "a blank entry"
    return None


def nothing_refusal(values: Mapping[str, object]) -> Optional[str]:
    """The refusal of the options in `values` (option name -> value) that name nothing, in one sentence, or None.

    A list with a blank entry beside real ones is not refused here: the option's own check refuses it (an unknown
    GPU, user or PID).
    """
    kinds: Dict[str, List[str]] = {}
    for name, value in sorted(values.items()):
        kind = names_nothing(value)
        if kind in _NOTHING_WORDS:
            kinds.setdefault(_NOTHING_WORDS[str(kind)], []).append(name)
    if not kinds:
        return None
    return "%s: a selection that names nothing is refused (omit the option to select any)" % "; ".join(
        "%s %s %s"
        % (
            ", ".join(names),
            "is" if len(names) == 1 else "are",
            kind.replace("lists of", "a list of") if len(names) == 1 else kind,
        )
        for kind, names in kinds.items()
    )


def null_refusal(args: Mapping[str, object]) -> Optional[str]:
    """The refusal of a module's arguments as given (`args`, before Ansible's type checks) where a selection option is
    null, or None.

    A module cannot tell an option given as null from one left out (both are None in its params), and "left out"
    selects any: the collection's action plugin (plugins/plugin_utils/_interpreter.py) asks this on the controller,
    which sees the arguments as given, before the module runs. The other options given are worded with them.
    """
    given = {name: args[name] for name in SELECTION_OPTIONS if name in args}
    if not any(value is None for value in given.values()):
        return None
    return nothing_refusal(given)
