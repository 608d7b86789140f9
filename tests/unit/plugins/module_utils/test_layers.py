"""The two domains of plugins/module_utils (CONTRIBUTING.md, docs/architecture.md): gpu/ never imports vllm/, and
nothing is left beside the two subpackages. Read from the sources' import statements (ast), so a lazy import inside a
function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

MODULE_UTILS = Path(__file__).resolve().parents[4] / "plugins" / "module_utils"
PACKAGE = "ansible_collections.gpuops.nvidia.plugins.module_utils"


def imported(path):
    """Every module path an import statement of `path` names (from X import a -> X.a and X)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update("%s.%s" % (node.module, alias.name) for alias in node.names)
    return names


@pytest.mark.parametrize("path", sorted((MODULE_UTILS / "gpu").glob("*.py")), ids=lambda path: path.name)
def test_the_gpu_side_never_imports_the_vllm_side(path):
    assert [name for name in imported(path) if name.startswith(PACKAGE + ".vllm")] == []


def test_every_module_util_lives_in_a_domain():
    assert sorted(path.name for path in MODULE_UTILS.glob("*.py")) == []
    assert {path.name for path in MODULE_UTILS.iterdir() if path.is_dir() and path.name != "__pycache__"} == {
        "gpu",
        "vllm",
    }


def test_the_check_sees_an_import_of_the_vllm_side(tmp_path):
    # The premise: a gpu/ file that imported vllm/ would be caught, at the top or inside a function.
    source = tmp_path / "x.py"
    source.write_text("def f():\n    from %s.vllm import _http\n" % PACKAGE)
    assert PACKAGE + ".vllm._http" in imported(source)
