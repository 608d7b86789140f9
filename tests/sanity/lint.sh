#!/usr/bin/env bash
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Lint the collection from the repo root: `ruff check` and `ruff format --check` (every Python file; rules and
# format in ruff.toml), `mypy` (type hints of plugins/: strict on plugins/module_utils; settings in mypy.ini),
# `antsibull-changelog lint`
# (changelogs/fragments), `antsibull-docs lint-collection-docs --plugin-docs` (module and role docs:
# schema, markup, and the O()/RV() references that the docs renderer does not check), then
# ansible-lint (production profile, offline; see .ansible-lint).
#   tests/sanity/lint.sh [ANSIBLE-LINT ARGS...]
# The collection resolves as gpuops.nvidia through .collections/ansible_collections/gpuops/nvidia,
# a symlink to the repo root, created here when missing. GPUOPS_VENV: default <repo>/.venv.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
VENV=${GPUOPS_VENV:-$REPO/.venv}
for tool in ruff mypy ansible-lint antsibull-changelog antsibull-docs; do
    [[ -x $VENV/bin/$tool ]] || { echo "lint.sh: no $tool in $VENV (set GPUOPS_VENV)" >&2; exit 2; }
done

collection_link=$REPO/.collections/ansible_collections/gpuops/nvidia
if [[ ! -e $collection_link ]]; then
    mkdir -p "$(dirname "$collection_link")"
    ln -sfn ../../.. "$collection_link"
fi

cd "$REPO"
# All of them run; the script fails when any does.
echo "== ruff check" >&2
ruff_rc=0
"$VENV/bin/ruff" check --quiet . || ruff_rc=$?
echo "== ruff format --check" >&2
"$VENV/bin/ruff" format --check --quiet . || ruff_rc=$?
echo "== mypy (plugins/, strict on plugins/module_utils)" >&2
mypy_rc=0
"$VENV/bin/mypy" || mypy_rc=$?
echo "== antsibull-changelog lint" >&2
changelog_rc=0
"$VENV/bin/antsibull-changelog" lint || changelog_rc=$?
echo "== antsibull-docs lint-collection-docs --plugin-docs" >&2
docs_rc=0
# It reads the collection where it resolves as gpuops.nvidia, and the ansible-doc of this venv.
(cd "$collection_link" && PATH=$VENV/bin:$PATH "$VENV/bin/antsibull-docs" lint-collection-docs --plugin-docs .) || docs_rc=$?
echo "== ansible-lint" >&2
lint_rc=0
# ansible-lint warns when its own bin directory is not on PATH, and runs ansible-* helpers from there.
PATH=$VENV/bin:$PATH ANSIBLE_COLLECTIONS_PATH=$REPO/.collections "$VENV/bin/ansible-lint" "$@" || lint_rc=$?
(( ruff_rc == 0 )) || echo "lint.sh: ruff failed (rc $ruff_rc)" >&2
(( mypy_rc == 0 )) || echo "lint.sh: mypy failed (rc $mypy_rc)" >&2
(( changelog_rc == 0 )) || echo "lint.sh: antsibull-changelog lint failed (rc $changelog_rc)" >&2
(( docs_rc == 0 )) || echo "lint.sh: antsibull-docs lint-collection-docs failed (rc $docs_rc)" >&2
(( ruff_rc == 0 && mypy_rc == 0 && changelog_rc == 0 && docs_rc == 0 && lint_rc == 0 ))
