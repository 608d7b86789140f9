"""Every module installs _zipload before it imports the collection's other module_utils (each compiled once, not twice,
from the AnsiballZ zip: plugins/module_utils/_zipload.py)."""

from __future__ import annotations

import ast
from pathlib import Path

MODULES = Path(__file__).resolve().parents[2] / "plugins" / "modules"
PACKAGE = "ansible_collections.gpuops.nvidia.plugins.module_utils"


def late_installs(root=MODULES):
    """["module: why"] for each module that imports a collection module_utils before `_zipload.install()`."""
    found = []
    for path in sorted(root.glob("*.py")):
        installed = False
        for node in ast.parse(path.read_text(), str(path)).body:
            if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                    and ast.unparse(node.value.func) == "_zipload.install"):
                installed = True
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE) and not installed:
                names = [alias.name for alias in node.names]
                if names != ["_zipload"]:
                    found.append("%s: imports %s from %s before _zipload.install()" % (path.name, ", ".join(names), node.module))
        if not installed:
            found.append("%s: never calls _zipload.install()" % path.name)
    return found


def test_every_module_installs_zipload_before_its_module_utils():
    assert list(MODULES.glob("*.py")) and late_installs() == []


def test_a_module_importing_before_the_install_is_found(tmp_path):
    (tmp_path / "early.py").write_text(
        "from %s import _zipload\nfrom %s import _gpus\n_zipload.install()\n" % (PACKAGE, PACKAGE))
    (tmp_path / "never.py").write_text("from %s import _options\n" % PACKAGE)
    (tmp_path / "good.py").write_text("from %s import _zipload\n_zipload.install()\nfrom %s import _gpus\n" % (PACKAGE, PACKAGE))
    assert late_installs(tmp_path) == [
        "early.py: imports _gpus from %s before _zipload.install()" % PACKAGE,
        "never.py: imports _options from %s before _zipload.install()" % PACKAGE,
        "never.py: never calls _zipload.install()"]
