"""Run ansible / ansible-playbook from this checkout against simulated nodes, as an operator would.

Both go through tests/ansible_api.py (ansible-runner's events and stats); these keep the shapes the
tests use: module() -> {host: (status, result)}, playbook() -> (rc, output, recap).
"""

from __future__ import annotations

import json
from pathlib import Path

import ansible_api

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"


def module(inventory, name, args=None, check=False, timeout=120):
    """Run module `name` ad hoc on every host of `inventory`.

    Returns {host: (status, result)} with status SUCCESS, CHANGED or FAILED! and the module's JSON result.
    """
    run = ansible_api.run(
        inventory,
        REPO,
        module=name,
        module_args=json.dumps(args) if args else None,
        args=["--check"] if check else (),
        envvars=ansible_api.environment(VENV_BIN, REPO / "ansible.cfg"),
        timeout=timeout,
    )
    results = run.results()
    assert results, "no result from ansible (rc %s, %s):\n%s" % (run.rc, run.status, run.output)
    return results


def only(results):
    """The (status, result) of the single host in `results`."""
    assert len(results) == 1, results
    return next(iter(results.values()))


def playbook(inventory, path, *args, timeout=300, bin_dir=VENV_BIN):
    """Run ansible-playbook from `bin_dir` (default: .venv's controller); return (returncode, output, {host: recap counters})."""
    run = ansible_api.run(
        inventory,
        REPO,
        playbook=path,
        args=args,
        envvars=ansible_api.environment(bin_dir, REPO / "ansible.cfg"),
        timeout=timeout,
    )
    playbook.last_seconds = run.elapsed_s
    recap = {
        host: {key: counts[key] for key in ("ok", "changed", "unreachable", "failed")}
        for host, counts in run.recap().items()
    }
    return run.rc, run.output, recap
