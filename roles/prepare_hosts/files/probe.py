# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# What a GPU host has for gpuops.nvidia: run as `PYTHON -c "$(cat probe.py)" VENV [INTERPRETER...]` by the
# prepare_hosts role (python3 -c, so it reads nothing and writes nothing). PYTHON is the Python that would make the
# venv; each INTERPRETER is one the modules would run with without the venv (the first counts). Prints one JSON object. Runs on
# Python 3.6 and newer, so that an old python3 gets a clear answer instead of a syntax error.
import json
import os
import subprocess
import sys

# Runs in each interpreter: its version and the installed versions of the libraries the modules import.
LIBRARIES = r"""
import json, sys
out = {"executable": sys.executable, "version": "%d.%d.%d" % tuple(sys.version_info[:3])}
try:
    from importlib import metadata
except ImportError:
    metadata = None
for dist, module in (("nvidia-ml-py", "pynvml"), ("psutil", "psutil")):
    try:
        imported = __import__(module)
    except Exception:
        out[dist] = None
        continue
    try:
        out[dist] = metadata.version(dist)
    except Exception:
        # pynvml from another distribution (the old pynvml project) has no nvidia-ml-py version: below any floor.
        out[dist] = getattr(imported, "__version__", None) if dist == "psutil" else "unknown"
packaging = False
for module in ("packaging.requirements", "pkg_resources"):
    try:
        __import__(module)
        packaging = True
        break
    except Exception:
        pass
out["packaging"] = packaging
print(json.dumps(out))
"""


def libraries(python):
    """What LIBRARIES prints in `python`, or {"exists": False} where it cannot be run."""
    if os.sep in python and not os.access(python, os.X_OK):
        return {"path": python, "exists": False}
    try:
        output = subprocess.check_output(
            [python, "-c", LIBRARIES], stderr=subprocess.STDOUT, universal_newlines=True, timeout=60
        )
        found = json.loads(output.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError) as error:
        return {"path": python, "exists": os.sep in python, "error": str(error).strip()[:300]}
    found.update(path=python, exists=True)
    return found


def ensurepip():
    """True when this Python's venv can install pip (Debian and Ubuntu ship ensurepip in python3-venv)."""
    try:
        import ensurepip as module

        return bool(module.version())
    except Exception:
        return False


def os_release():
    """ID and ID_LIKE of /etc/os-release."""
    found = {"id": "", "id_like": []}
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        try:
            with open(path) as handle:
                for line in handle:
                    key, _sep, value = line.strip().partition("=")
                    if key in ("ID", "ID_LIKE"):
                        found[key.lower()] = value.strip("\"'").split() if key == "ID_LIKE" else value.strip("\"'")
            break
        except OSError:
            continue
    return found


def venv_directory(venv):
    """Whether the venv's directory exists, is a venv (pyvenv.cfg) and what else it holds (a few names)."""
    if not os.path.isdir(venv):
        return {"exists": False}
    return {
        "exists": True,
        "pyvenv_cfg": os.path.isfile(os.path.join(venv, "pyvenv.cfg")),
        "entries": sorted(os.listdir(venv))[:8],
    }


def main():
    venv = sys.argv[1]
    this = {"executable": sys.executable, "version": "%d.%d.%d" % tuple(sys.version_info[:3]), "ensurepip": ensurepip()}
    interpreters = []
    for python in sys.argv[2:] + [sys.executable]:
        if python and python not in [found["path"] for found in interpreters]:
            interpreters.append(libraries(python))
    print(
        json.dumps(
            {
                "python": this,
                "os": os_release(),
                "venv": libraries(os.path.join(venv, "bin", "python")),
                "venv_dir": venv_directory(venv),
                "interpreters": interpreters,
            }
        )
    )


main()
