"""Counting what a child Python compiles: source to put first in a `python -c` script.

The interpreter raises the "compile" audit event for every compile() (sys.addaudithook, PEP 578), zipimport's
included; the hook counts the files whose path contains a marker, by the path after it, in the dict `compiled`.
"""

from __future__ import annotations

_HOOK = r'''
import sys
compiled = {}

def _count_compile(event, args):
    if event == "compile" and isinstance(args[1], str) and %(marker)r in args[1]:
        name = args[1].split(%(marker)r, 1)[1]
        compiled[name] = compiled.get(name, 0) + 1

sys.addaudithook(_count_compile)
'''


def hook_source(marker):
    """The hook's source for files whose path contains `marker` (e.g. "/module_utils/")."""
    return _HOOK % {"marker": marker}
