#!/usr/bin/env bash
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Run `ansible-test sanity` on the collection, with no ignore entries, on a machine that reaches only
# the package registries (no Docker, pyenv Pythons).
#
#   tests/sanity/run.sh [--no-targets] [ANSIBLE-TEST SANITY ARGS...]
#
# 1. Copies the files git sees (tracked, plus untracked files git does not ignore) into a fresh
#    <tmp>/ansible_collections/gpuops/nvidia: ansible-test needs that path, and the copy keeps
#    .venv/, tests/output/ and build outputs out of the tests.
# 2. `ansible-test sanity --venv --python 3.12` (every sanity test, on the Python version of the venv
#    holding ansible-test; extra arguments go to this run).
# 3. `ansible-test sanity --venv --test compile --test import --python 3.X` for every other target
#    Python 3.9-3.13 found under $PYENV_ROOT/versions (skipped with --no-targets).
# Exits non-zero when any run fails, after a summary of all runs.
#
# Two workarounds for machines that reach the package registries only:
# - ansible-test bootstraps pip in its venvs with a get-pip script from a host outside the package
#   registries. Its cache, ~/.ansible/test/cache/get_pip_<ver>.py, is seeded with
#   tests/sanity/get_pip_from_wheel.py, which installs pip from the pip wheel cached beside it
#   (downloaded once from PyPI).
# - ansible-test strips the environment, so pyenv's shims exit 127. A directory of real python3.X
#   symlinks goes first on PATH. It is kept under ~/.ansible/test because the venvs ansible-test
#   caches in ~/.ansible/test/venv are built from those paths.
#
# Environment: GPUOPS_VENV (default <repo>/.venv, must hold ansible-core's ansible-test),
# PYENV_ROOT (default /root/.pyenv).
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${GPUOPS_VENV:-$REPO/.venv}
PYENV_ROOT=${PYENV_ROOT:-/root/.pyenv}
TARGET_PYTHONS=(3.9 3.10 3.11 3.12 3.13)
ANSIBLE_TEST_HOME=$HOME/.ansible/test
PIP_CACHE_DIR_FOR_BOOTSTRAP=$ANSIBLE_TEST_HOME/cache
PYTHON_BIN_DIR=$ANSIBLE_TEST_HOME/gpuops-python-bin

run_targets=1
sanity_args=()
for arg in "$@"; do
    case $arg in
        --no-targets) run_targets=0 ;;
        *) sanity_args+=("$arg") ;;
    esac
done

log() { printf '== %s\n' "$*" >&2; }
die() { printf 'run.sh: %s\n' "$*" >&2; exit 2; }

[[ -x $VENV/bin/ansible-test ]] || die "no ansible-test in $VENV (set GPUOPS_VENV)"
# The controller-side tests run on the venv's Python version (3.12 with ansible-core 2.21).
CONTROLLER_PYTHON=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# ansible-test shares its venvs in ~/.ansible/test/venv and rebuilds one it finds half-made, which
# breaks a concurrent run that is using it: one run.sh at a time.
mkdir -p "$ANSIBLE_TEST_HOME"
exec 9>"$ANSIBLE_TEST_HOME/gpuops-sanity.lock"
if ! flock --nonblock 9; then
    log "waiting for another tests/sanity/run.sh to finish"
    flock 9
fi

# Newest installed patch release of Python 3.X under pyenv, as the path of its python3.X binary.
pyenv_python() {
    local version=$1 dir
    dir=$(find "$PYENV_ROOT/versions" -mindepth 1 -maxdepth 1 -name "$version.*" -printf '%f\n' 2>/dev/null \
        | grep -E "^${version//./\\.}\.[0-9]+$" | sort -V | tail -n 1) || true
    [[ -n $dir && -x $PYENV_ROOT/versions/$dir/bin/python$version ]] && echo "$PYENV_ROOT/versions/$dir/bin/python$version"
}

# Workaround 2: real python3.X first on PATH.
mkdir -p "$PYTHON_BIN_DIR"
available_pythons=()
for version in "${TARGET_PYTHONS[@]}"; do
    if interpreter=$(pyenv_python "$version"); then
        ln -sfn "$interpreter" "$PYTHON_BIN_DIR/python$version"
        available_pythons+=("$version")
    else
        rm -f "$PYTHON_BIN_DIR/python$version"
        log "Python $version not found under $PYENV_ROOT/versions: its compile/import tests are skipped"
    fi
done
[[ " ${available_pythons[*]} " == *" $CONTROLLER_PYTHON "* ]] || die "controller Python $CONTROLLER_PYTHON not found under $PYENV_ROOT/versions"
export PATH=$PYTHON_BIN_DIR:$PATH

# Workaround 1: seed ansible-test's get-pip cache for the pip version it bootstraps on each Python.
pip_versions=$("$VENV/bin/python" - "${available_pythons[@]}" <<'EOF'
import sys, types
from ansible_test._internal.python_requirements import get_venv_packages
print("\n".join(sorted({get_venv_packages(types.SimpleNamespace(version=v))["pip"] for v in sys.argv[1:]})))
EOF
)
mkdir -p "$PIP_CACHE_DIR_FOR_BOOTSTRAP"
for pip_version in $pip_versions; do
    if ! compgen -G "$PIP_CACHE_DIR_FOR_BOOTSTRAP/pip-$pip_version-*.whl" >/dev/null; then
        log "Downloading the pip $pip_version wheel from PyPI into $PIP_CACHE_DIR_FOR_BOOTSTRAP"
        "$VENV/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
            --dest "$PIP_CACHE_DIR_FOR_BOOTSTRAP" "pip==$pip_version"
    fi
    install -m 0644 "$REPO/tests/sanity/get_pip_from_wheel.py" "$PIP_CACHE_DIR_FOR_BOOTSTRAP/get_pip_${pip_version//./_}.py"
done

# A copy of the collection at the path ansible-test requires.
work_dir=$(mktemp -d "${TMPDIR:-/tmp}/gpuops-sanity.XXXXXX")
trap 'rm -rf "$work_dir"' EXIT
collection_dir=$work_dir/ansible_collections/gpuops/nvidia
mkdir -p "$collection_dir"
git -C "$REPO" ls-files -z --cached --others --exclude-standard \
    | (cd "$REPO" && while IFS= read -r -d '' path; do if [[ -e $path || -L $path ]]; then printf '%s\0' "$path"; fi; done) \
    | tar -C "$REPO" --null --files-from=- -cf - \
    | tar -C "$collection_dir" -xf -

summary=()
findings=()
failed=0
run_sanity() {
    local label=$1 start rc log_file=$work_dir/run-${#summary[@]}.log
    shift
    log "$label: ansible-test sanity $*"
    start=$SECONDS
    set +o errexit
    (cd "$collection_dir" && "$VENV/bin/ansible-test" sanity "$@") 2>&1 | tee "$log_file"
    rc=${PIPESTATUS[0]}
    set -o errexit
    (( rc == 0 )) || failed=1
    summary+=("$(printf '%-4s %4ss  %s' "$( ((rc == 0)) && echo ok || echo FAIL)" $((SECONDS - start)) "$label (rc $rc)")")
    # ansible-test reports each finding as "ERROR: path:line:column: message".
    mapfile -t -O "${#findings[@]}" findings < <(grep -E '^ERROR: [^ ]+:[0-9]+:[0-9]+: ' "$log_file" | sed "s/^ERROR: /[$label] /")
}

run_sanity "all tests, Python $CONTROLLER_PYTHON" --venv --python "$CONTROLLER_PYTHON" "${sanity_args[@]}"
if (( run_targets )); then
    for version in "${available_pythons[@]}"; do
        # The run above already did compile and import on the controller Python.
        [[ $version == "$CONTROLLER_PYTHON" ]] && continue
        run_sanity "compile+import, Python $version" --venv --test compile --test import --python "$version"
    done
fi

printf '\n== ansible-test sanity summary (ansible-core %s)\n' "$("$VENV/bin/python" -c 'from ansible.release import __version__; print(__version__)')"
printf '%s\n' "${summary[@]}"
command -v shellcheck >/dev/null || printf 'WARNING: shellcheck is not installed, so its sanity test was skipped (apt-get install shellcheck)\n'
if (( failed )); then
    if (( ${#findings[@]} )); then
        printf '\n%s finding(s), paths relative to the collection root:\n' "${#findings[@]}"
        printf '%s\n' "${findings[@]}"
    fi
    printf 'FAILED: see the output above\n'
    exit 1
fi
printf 'all sanity runs passed\n'
