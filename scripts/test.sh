#!/usr/bin/env bash
# Every test of this checkout: ansible-test sanity, ansible-lint (production profile), promtool (the guard's rules
# and metrics), then pytest
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
step "promtool (guard rules, their tests, metrics)" tests/prometheus/check.sh
[ ${#failed[@]} -gt 0 ] && echo "FAILED so far: ${failed[*]} (pytest runs anyway)"
# pytest last, so that its summary line closes the output.
echo "== pytest (unit, simulator, integration on simulated GPU nodes)"
# In PYTEST_WORKERS pytest-xdist workers (default 3; 0 runs the tests in this process): most integration tests wait on
# simulated nodes and ansible-playbook runs, so 3 workers fit 2 cores. Every test makes its own nodes and ports.
t0=$SECONDS
.venv/bin/pytest -q -n "${PYTEST_WORKERS:-3}"
rc=$?
echo "== pytest: rc $rc ($((SECONDS - t0)) s)"
left=$(tests/sim/gpunode list)
[ -n "$left" ] && echo "warning: simulated nodes left running: $left" >&2
[ $rc -eq 0 ] && [ ${#failed[@]} -eq 0 ]
