"""_zipload: the collection's module_utils, imported from a zip as Ansible ships them, are compiled once each.

Each test builds a zip laid out as an AnsiballZ payload (ansible_collections/gpuops/nvidia/plugins/module_utils/...)
with the real _zipload.py and probe modules, and imports from it in a fresh interpreter (-I -S: only the zip and the
standard library), counting compilations through the interpreter's "compile" audit event.
"""

from __future__ import annotations

import json
import py_compile
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from compile_audit import hook_source

ZIPLOAD = Path(__file__).resolve().parents[4] / "plugins" / "module_utils" / "_zipload.py"
PACKAGE_DIR = "ansible_collections/gpuops/nvidia/plugins/module_utils/"
PACKAGE = "ansible_collections.gpuops.nvidia.plugins.module_utils"

PROBES = {
    # _zl_a imports _zl_b (a module_utils importing another, as _gpus imports _nvml); CRLF line endings and a
    # coding cookie, which zipimport accepts.
    "_zl_a.py": b"# -*- coding: utf-8 -*-\r\nfrom ansible_collections.gpuops.nvidia.plugins.module_utils import _zl_b\r\n"
                b"NAME = 'caf\xc3\xa9'\r\nVALUE = _zl_b.VALUE + 1\r\n",
    "_zl_b.py": b"VALUE = 41\n\n\ndef fail():\n    raise ValueError('raised in _zl_b')  # the line a traceback shows\n",
    "_zl_pkg/__init__.py": b"KIND = 'package'\n",
}

CHILD = hook_source("/module_utils/") + r"""
import json, traceback
sys.path.insert(0, sys.argv[1])
from ansible_collections.gpuops.nvidia.plugins.module_utils import _zipload
if sys.argv[2] == "install":
    _zipload.install()
    _zipload.install()  # a second call adds nothing
from ansible_collections.gpuops.nvidia.plugins.module_utils import _zl_a, _zl_b, _zl_pkg, _zl_c
try:
    _zl_b.fail()
except ValueError:
    shown = traceback.format_exc()
try:
    import ansible_collections.gpuops.nvidia.plugins.module_utils._zl_missing
    missing = "imported"
except ModuleNotFoundError as exc:
    missing = exc.name
print(json.dumps({
    "compiled": compiled, "finders": [type(f).__name__ if not isinstance(f, type) else f.__name__ for f in sys.meta_path],
    "values": [_zl_a.NAME, _zl_a.VALUE, _zl_pkg.KIND, _zl_c.KIND],
    "files": {m.__name__.rsplit(".", 1)[1]: m.__file__ for m in (_zl_a, _zl_b, _zl_pkg, _zl_c)},
    "loaders": {m.__name__.rsplit(".", 1)[1]: type(m.__spec__.loader).__name__ for m in (_zl_a, _zl_b, _zl_pkg, _zl_c)},
    "traceback": shown, "missing": missing}))
"""


@pytest.fixture(scope="module")
def payload(tmp_path_factory):
    """A zip as AnsiballZ builds one, plus _zl_c held as bytecode only (zipimport loads it without compiling)."""
    work = tmp_path_factory.mktemp("zipload")
    source_c = work / "_zl_c.py"
    source_c.write_text("KIND = 'bytecode'\n")
    bytecode = py_compile.compile(str(source_c), cfile=str(work / "_zl_c.pyc"), doraise=True)
    path = work / "payload.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in ("ansible_collections/", "ansible_collections/gpuops/", "ansible_collections/gpuops/nvidia/",
                        "ansible_collections/gpuops/nvidia/plugins/", PACKAGE_DIR):
            archive.writestr(package + "__init__.py", "")
        archive.write(ZIPLOAD, PACKAGE_DIR + "_zipload.py")
        for name, content in PROBES.items():
            archive.writestr(PACKAGE_DIR + name, content)
        archive.write(bytecode, PACKAGE_DIR + "_zl_c.pyc")
    return path


def run_child(payload, mode):
    done = subprocess.run([sys.executable, "-I", "-S", "-c", CHILD, str(payload), mode],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_each_source_module_is_compiled_once_with_the_finder(payload):
    found = run_child(payload, "install")
    # The package's __init__.py and _zipload itself are imported before the finder is installed, packages are left
    # to zipimport: compiled twice, as ever.
    assert {name: count for name, count in found["compiled"].items() if name not in ("__init__.py", "_zipload.py")} == {
        "_zl_a.py": 1, "_zl_b.py": 1, "_zl_pkg/__init__.py": 2}
    # Once, just before the path-based finder (whatever stands first, such as ansible-test's import checker, stays).
    assert found["finders"] == ["BuiltinImporter", "FrozenImporter", "_ZipSourceFinder", "PathFinder"]
    assert found["loaders"] == {"_zl_a": "_SourceLoader", "_zl_b": "_SourceLoader", "_zl_pkg": "zipimporter",
                                "_zl_c": "zipimporter"}


def test_zipimport_alone_compiles_each_source_module_twice(payload):
    """Why the finder exists (python/cpython#141276): should a CPython compile once, this fails and the finder can go."""
    found = run_child(payload, "plain")
    assert found["compiled"]["_zl_a.py"] == 2 and found["compiled"]["_zl_b.py"] == 2
    assert "_ZipSourceFinder" not in found["finders"]


def test_modules_behave_as_zipimport_loads_them(payload):
    """Same values, __file__, traceback source lines and ModuleNotFoundError as without the finder."""
    with_finder, without = run_child(payload, "install"), run_child(payload, "plain")
    assert with_finder["values"] == without["values"] == ["café", 42, "package", "bytecode"]
    assert with_finder["files"] == without["files"]
    assert with_finder["files"]["_zl_b"] == str(payload) + "/" + PACKAGE_DIR + "_zl_b.py"
    assert "raise ValueError('raised in _zl_b')  # the line a traceback shows" in with_finder["traceback"]
    assert with_finder["missing"] == without["missing"] == PACKAGE + "._zl_missing"


def test_the_collection_imported_from_directories_is_left_to_the_import_system():
    """As in the tests and ansible-test: no zip on the package's path, no spec from the finder."""
    from ansible_collections.gpuops.nvidia.plugins.module_utils import _zipload, _options

    finder = _zipload._ZipSourceFinder()  # pylint: disable=protected-access
    assert finder.find_spec(PACKAGE + "._options", list(sys.modules[PACKAGE].__path__)) is None
    assert finder.find_spec("json.decoder", None) is None
    assert _options.__spec__.loader.__class__.__name__ == "SourceFileLoader"
