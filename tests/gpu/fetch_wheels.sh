#!/usr/bin/env bash
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Download the wheels the GPU check needs on a host without PyPI into tests/gpu/wheels/ (gitignored):
# ansible-core, ansible-runner, nvidia-ml-py, psutil, setproctitle and all their dependencies, for CPython 3.10-3.12
# on manylinux x86_64 (override with PYTHON_VERSIONS="3.11 3.12", PLATFORM_ARCH=aarch64).
# Run it where PyPI is reachable; tests/gpu/run.sh installs from the directory with --no-index.
#
#   tests/gpu/fetch_wheels.sh [PYTHON]     (PYTHON runs pip; default python3)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${1:-python3}
WHEELS=$HERE/wheels
read -r -a versions <<<"${PYTHON_VERSIONS:-3.10 3.11 3.12}"
arch=${PLATFORM_ARCH:-x86_64}
# ansible-core's requires_ansible floor (meta/runtime.yml); each Python gets the newest release it supports.
# typing-extensions: cryptography needs it below Python 3.11 behind a python_full_version marker, which
# `pip download --python-version` evaluates for the Python running pip, so it is named here.
requirements=("ansible-core>=2.17" ansible-runner==2.4.3 nvidia-ml-py psutil setproctitle typing-extensions)

platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux_2_5 manylinux1; do
    platforms+=(--platform "${tag}_$arch")
done

mkdir -p "$WHEELS"
for version in "${versions[@]}"; do
    echo "== wheels for CPython $version ($arch)" >&2
    "$PYTHON" -m pip download --quiet --disable-pip-version-check --only-binary=:all: --implementation cp \
        --python-version "$version" "${platforms[@]}" --dest "$WHEELS" "${requirements[@]}"
done
echo "$(find "$WHEELS" -name '*.whl' | wc -l) wheels, $(du -sh "$WHEELS" | cut -f1), in $WHEELS" >&2
