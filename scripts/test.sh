#!/usr/bin/env bash
# Every test of this checkout: ansible-test sanity, ansible-lint (production profile), then pytest
# (unit tests, simulator tests, integration tests on simulated GPU nodes). Run after scripts/setup.sh.
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.." || exit 1
export PATH="$PWD/.venv/bin:$PATH"
failed=()

step() { # NAME COMMAND...
  local name=$1; shift
  echo "== $name"
  local t0=$SECONDS
  if "$@"; then echo "== $name: ok ($((SECONDS - t0)) s)"; else echo "== $name: FAILED ($((SECONDS - t0)) s)"; failed+=("$name"); fi
}

step "ansible-test sanity" tests/sanity/run.sh
step "ansible-lint" tests/sanity/lint.sh
[ ${#failed[@]} -gt 0 ] && echo "FAILED so far: ${failed[*]} (pytest runs anyway)"
# pytest last, so that its summary line closes the output.
echo "== pytest (unit, simulator, integration on simulated GPU nodes)"
.venv/bin/pytest -q
rc=$?
left=$(tests/sim/gpunode list)
[ -n "$left" ] && echo "warning: simulated nodes left running: $left" >&2
[ $rc -eq 0 ] && [ ${#failed[@]} -eq 0 ]
