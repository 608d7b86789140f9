"""Every function in plugins/ is under 60 lines (docstring included), so that each one can be read at once."""

from __future__ import annotations

import ast
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
MAX_LINES = 59


def long_functions(root=PLUGINS, limit=MAX_LINES):
    """["path:line name (N lines)"] of the functions and methods under `root` longer than `limit` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append("%s:%d %s (%d lines)" % (path.relative_to(root.parent), node.lineno, node.name, lines))
    return found


def test_every_function_in_plugins_is_under_60_lines():
    assert long_functions() == []


def test_a_long_function_is_found(tmp_path):
    body = "".join("    x = %d\n" % number for number in range(59))
    (tmp_path / "m.py").write_text("def short():\n    pass\n\n\ndef long():\n%s" % body)
    assert long_functions(tmp_path) == ["%s/m.py:5 long (60 lines)" % tmp_path.name]
