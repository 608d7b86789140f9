# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Offline stand-in for ansible-test's get-pip bootstrap script.

tests/sanity/run.sh copies this file to ``~/.ansible/test/cache/get_pip_<ver>.py`` next to the pip
wheel ``pip-<ver>-py3-none-any.whl`` it downloaded from PyPI. ansible-test runs it in a fresh
virtual environment that has no pip, as
``python get_pip_<ver>.py --disable-pip-version-check pip==<ver> --no-setuptools --no-wheel``
(through its quiet_pip.py wrapper, which runs this file as ``__main__``).

It runs pip straight from the wheel (pip supports being run from its own wheel) and installs that
wheel. The requirement ``pip==<ver>`` is replaced by the wheel's path, so pip itself needs no index;
get-pip-only flags (--no-setuptools, --no-wheel, --no-pip) are dropped; any other argument is passed
to ``pip install`` unchanged. Exits with pip's exit status.
"""

from __future__ import annotations

import glob
import os
import sys

GET_PIP_ONLY_FLAGS = frozenset(("--no-setuptools", "--no-wheel", "--no-pip"))


def find_pip_wheel(cache_dir, pip_version):
    """Return the path of the cached ``pip-<pip_version>-*.whl`` in cache_dir; raise SystemExit naming it when missing."""
    wheels = sorted(glob.glob(os.path.join(cache_dir, "pip-%s-*.whl" % pip_version)))
    if not wheels:
        raise SystemExit(
            "get_pip stand-in: no pip %s wheel in %s; run tests/sanity/run.sh to cache it" % (pip_version, cache_dir)
        )
    return wheels[0]


def main(argv):
    """Install pip from the cached wheel; argv are get-pip's arguments (without the program name)."""
    cache_dir = os.path.dirname(os.path.abspath(__file__))
    # The file is named get_pip_<major>_<minor>[_<patch>].py by ansible-test's cache convention.
    pip_version = os.path.splitext(os.path.basename(__file__))[0][len("get_pip_") :].replace("_", ".")
    wheel = find_pip_wheel(cache_dir, pip_version)

    install_args = []
    for arg in argv:
        if arg in GET_PIP_ONLY_FLAGS:
            continue
        if arg == "pip" or arg.startswith("pip=="):
            arg = wheel
        install_args.append(arg)
    if wheel not in install_args:
        install_args.append(wheel)

    sys.path.insert(0, wheel)
    from pip._internal.cli.main import main as pip_main  # pylint: disable=import-outside-toplevel

    return pip_main(["install"] + install_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
