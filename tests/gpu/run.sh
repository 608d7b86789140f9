#!/usr/bin/env bash
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# The GPU acceptance check (tests/gpu/README.md), on a host with an NVIDIA GPU and its driver:
#
#   tests/gpu/run.sh [--out DIR] [other check.py options]
#
# 1. Finds python3 >= 3.10 (GPUCHECK_PYTHON first, else python3, python3.13 ... python3.10 on PATH).
# 2. Exits 2 with "skipped: no NVIDIA GPU (...)" where the NVIDIA driver or a GPU is missing.
# 3. Installs the Python packages this interpreter lacks (ansible-core, nvidia-ml-py, psutil, setproctitle)
#    from tests/gpu/wheels/ (made by tests/gpu/fetch_wheels.sh) into a private directory put on
#    PYTHONPATH (GPUCHECK_SITE, default $TMPDIR/gpuops-gpucheck-site-<python version>): no network.
# 4. Runs check.py under a hard limit: what is left of GPUCHECK_TOTAL seconds (default 460) after the steps
#    above, or GPUCHECK_TIMEOUT seconds where set; SIGKILL 15 s after the limit's SIGTERM. check.py gets
#    --deadline 40 s below the limit (a --deadline among the options wins) and skips what no longer fits,
#    so the whole run, install included, ends inside 8 minutes.
# Exit status: check.py's (0 ok, 1 a check failed, 2 skipped, 3 missing packages), 124 on the hard limit.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOTAL=${GPUCHECK_TOTAL:-460}
DEADLINE_MARGIN=40

find_python() {
    local candidate
    for candidate in ${GPUCHECK_PYTHON:-} python3 python3.13 python3.12 python3.11 python3.10; do
        command -v "$candidate" >/dev/null 2>&1 || continue
        if "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
    return 1
}

if ! PYTHON=$(find_python); then
    echo "error: no python3 >= 3.10 found (ansible-core needs it); set GPUCHECK_PYTHON" >&2
    exit 3
fi

"$PYTHON" "$HERE/check.py" --probe || exit $?

if ! missing=$("$PYTHON" "$HERE/check.py" --missing-packages); then
    echo "error: $PYTHON cannot run check.py --missing-packages" >&2
    exit 3
fi
if [[ -n $missing ]]; then
    if compgen -G "$HERE/wheels/*.whl" >/dev/null; then
        version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        site=${GPUCHECK_SITE:-${TMPDIR:-/tmp}/gpuops-gpucheck-site-$version}
        echo "installing $missing from $HERE/wheels into $site" >&2
        # shellcheck disable=SC2086 # $missing is a list of requirement names
        if ! "$PYTHON" -m pip install --quiet --disable-pip-version-check --no-index --no-cache-dir \
            --find-links "$HERE/wheels" --target "$site" --upgrade $missing; then
            echo "error: cannot install $missing from $HERE/wheels (run tests/gpu/fetch_wheels.sh for Python $version)" >&2
            exit 3
        fi
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "note: $PYTHON lacks $missing and there is no $HERE/wheels (tests/gpu/fetch_wheels.sh makes it)" >&2
    fi
fi

TIMEOUT=${GPUCHECK_TIMEOUT:-$((TOTAL - SECONDS))}
if ((TIMEOUT < DEADLINE_MARGIN + 60)); then
    echo "error: ${TIMEOUT} s left for the check (GPUCHECK_TOTAL ${TOTAL} s, ${SECONDS} s spent before it)" >&2
    exit 1
fi
exec timeout --signal=TERM --kill-after=15 "$TIMEOUT" "$PYTHON" "$HERE/check.py" \
    --deadline "$((TIMEOUT - DEADLINE_MARGIN))" "$@"
