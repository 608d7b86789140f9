# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Import this collection's module_utils from Ansible's module zip with one compilation each.

Ansible ships a module's module_utils as source inside the AnsiballZ zip, and Python compiles each one it imports on
every run. CPython's `zipimport` compiles a source module twice: once while it builds the module's spec
(`zipimporter.find_spec` -> `spec_from_loader` -> `zipimporter.get_filename`, which works the file name out by getting
the module's code) and again in `exec_module` (python/cpython#141276, where the duplicated work was reported; the fix
proposed in python/cpython#153799 was not merged when this was written; seen on every CPython from 3.9 to 3.13).
For gpu_wait, as check_gpus.yml runs it on every host of an inventory, the second compilation was 10-12 ms of the
host's CPU per run, a quarter of what the module cost beyond a ping (docs/scale.md). No library offers a finder for
this, hence this one.

`install()` (each module calls it before importing the collection's other module_utils) puts a finder on
`sys.meta_path`, just before the path-based finder, that answers only for modules of this package whose package path
entry is a zip that holds their source (`.py`): it builds the spec without compiling and compiles once when the
module is executed, as zipimport itself does (line endings normalized, `dont_inherit`, the same `__file__`).
Everything else (a package, a module the zip holds as bytecode only, the collection imported from directories, as
in the tests or ansible-test) is left to the normal import system. Nothing is written anywhere.
"""
from __future__ import annotations

import importlib.machinery
import sys
import zipimport

PACKAGE = "ansible_collections.gpuops.nvidia.plugins.module_utils"


class _SourceLoader:
    """Executes one module_utils file of the zip from the source that the finder read (PEP 451 loader)."""

    def __init__(self, importer, origin, source):
        self._importer = importer
        self._origin = origin
        self._source = source

    def create_module(self, spec):  # pylint: disable=unused-argument
        return None  # the default module object

    def exec_module(self, module):
        source, self._source = self._source, None
        if source is None:  # executed again (importlib.reload)
            source = self._importer.get_data(self._origin)
        # As zipimport._compile_source: universal newlines, then compile without this module's future flags.
        source = source.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        exec(compile(source, self._origin, "exec", dont_inherit=True), module.__dict__)  # pylint: disable=exec-used

    def get_source(self, fullname):  # pylint: disable=unused-argument
        """The source text (tracebacks read their lines through it)."""
        return self._importer.get_data(self._origin).decode("utf-8")

    def get_filename(self, fullname):  # pylint: disable=unused-argument
        return self._origin

    def is_package(self, fullname):  # pylint: disable=unused-argument
        return False


class _ZipSourceFinder:
    """Meta path finder for the modules of PACKAGE that a zip on the package's path holds as source."""

    def find_spec(self, name, path=None, target=None):  # pylint: disable=unused-argument
        package, _dot, leaf = name.rpartition(".")
        if package != PACKAGE or not path:
            return None
        for entry in path:
            importer = sys.path_importer_cache.get(entry)
            if importer is None:
                try:
                    importer = zipimport.zipimporter(entry)
                except zipimport.ZipImportError:
                    return None  # a directory: the normal import system, which compiles once and caches bytecode
                sys.path_importer_cache[entry] = importer
            if not isinstance(importer, zipimport.zipimporter):
                return None
            try:
                if importer.is_package(name):
                    return None
            except zipimport.ZipImportError:
                continue  # not in this entry of the package's path
            origin = entry + "/" + leaf + ".py"
            try:
                source = importer.get_data(origin)
            except OSError:
                return None  # held as bytecode only: zipimport loads that without compiling
            spec = importlib.machinery.ModuleSpec(name, _SourceLoader(importer, origin, source), origin=origin)
            spec.has_location = True  # __file__ = origin, as zipimport sets it
            return spec
        return None


def install():
    """Put the finder on sys.meta_path just before the path-based finder, which would hand these modules to zipimport
    (once per process; finders placed ahead of that one, such as ansible-test's import checker, keep their place)."""
    if any(isinstance(finder, _ZipSourceFinder) for finder in sys.meta_path):
        return
    path_finder = importlib.machinery.PathFinder  # on sys.meta_path as the class itself
    position = sys.meta_path.index(path_finder) if path_finder in sys.meta_path else len(sys.meta_path)
    sys.meta_path.insert(position, _ZipSourceFinder())
