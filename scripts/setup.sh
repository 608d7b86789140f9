#!/usr/bin/env bash
# Set up this checkout: .venv with every dependency, the collection linked under .collections/,
# and the simulated driver built. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."

pick_python() {
  # pyenv shims for non-default versions exit 127, so prefer real interpreters; ansible-core 2.21 needs >= 3.12.
  local c
  for c in ${PYTHON:-} "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.1[2-9]*/bin/python3.1[2-9] python3.13 python3.12 python3; do
    [ -n "$c" ] || continue
    if "$c" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' >/dev/null 2>&1; then
      echo "$c"; return 0
    fi
  done
  echo "no Python >= 3.11 found (set PYTHON=/path/to/python3.12)" >&2
  return 1
}

if [ ! -x .venv/bin/python ]; then
  py=$(pick_python)
  echo "setup: creating .venv with $py ($("$py" --version))"
  "$py" -m venv .venv
fi
stamp=.venv/.requirements-dev.sha
want=$(sha256sum requirements-dev.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing requirements-dev.txt into .venv"
  # (filter: some machines' pip configuration names local package folders that may not exist)
  .venv/bin/python -m pip install -q --disable-pip-version-check --upgrade pip 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
  .venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
  echo "$want" > "$stamp"
fi
# Debian tools the tests use: shellcheck (ansible-test skips its shellcheck test without it), sshd for
# SSH-reached simulated nodes, fuser and lsof for the scan comparisons. Installed here, before any
# simulated node runs: apt-get runs ldconfig, which replaces the host's /etc/ld.so.cache and with it
# the cache that running nodes bind over it. Tests that need a missing tool skip with the reason.
scripts/bench/ensure_tools.sh shellcheck sshd fuser lsof ||
  echo "setup: some Debian tools are missing (see above); the tests that need them will be skipped"
# The guard's end-to-end test (docs/guard.md): Prometheus, promtool, Alertmanager and node_exporter from Debian
# (installed with no service started; the tests run them as their own processes on 127.0.0.1), and ansible-rulebook
# from PyPI in its own venv, .venv-eda (requirements-eda.txt): it runs playbooks with the ansible-playbook of .venv
# (first on PATH), and its dependencies (aiohttp, drools_jpy, jpy for Java 17) stay out of .venv. It gets ansible-core
# all the same: without it, every start of ansible-rulebook logs an error that ansible-core is not installed.
scripts/bench/ensure_tools.sh prometheus promtool alertmanager node_exporter ||
  echo "setup: Prometheus' Debian packages are missing (see above); the guard's tests will fail"
# vLLM in containers (docs/vllm_server.md, "Containers"): podman (with conmon) and catatonit (podman's --init) from
# Debian; the container tests run podman inside simulated nodes, with the simulator's OCI runtime (tests/sim/simruntime)
# in place of runc or crun. No service starts.
scripts/bench/ensure_tools.sh podman catatonit ||
  echo "setup: podman's Debian packages are missing (see above); the container tests will fail"
eda_want=$(sha256sum requirements-eda.txt | cut -d' ' -f1)
if [ "$(cat .venv-eda/.installed 2>/dev/null)" != "$eda_want" ]; then
  echo "setup: installing requirements-eda.txt into .venv-eda"
  [ -x .venv-eda/bin/python ] || "$(readlink -f .venv/bin/python)" -m venv .venv-eda
  .venv-eda/bin/python -m pip install -q --disable-pip-version-check -r requirements-eda.txt 2>&1 | { grep -v "^WARNING: Location 'file:" || true; }
  echo "$eda_want" > .venv-eda/.installed
fi
mkdir -p .collections/ansible_collections/gpuops
ln -sfn ../../.. .collections/ansible_collections/gpuops/nvidia
tests/sim/gpunode build >/dev/null
echo "setup: ready (ansible-core $(.venv/bin/python -c "import ansible.release as r; print(r.__version__)"), $(.venv/bin/python --version))"
