# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The one way tests run Ansible: ansible-runner (controller side only), which returns events and stats.

Used by tests/integration/ansible_run.py (simulated nodes) and tests/gpu/gpucheck/ansible_run.py (the
GPU check). Results come from the runner's events (`runner_on_ok`, `runner_on_failed`,
`runner_on_unreachable`) and the play's stats, not from parsing printed output; the human-readable
output (stdout and stderr of the run, as an operator sees it) is kept for tests that look for a line.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
import time

import ansible_runner

# Task-result events and the status word `ansible -o` prints for each.
_RESULT_EVENTS = {"runner_on_ok": None, "runner_on_failed": "FAILED!", "runner_on_unreachable": "UNREACHABLE!"}
# Keys that `ansible -o` leaves out of the result it prints (ansible.plugins.callback.CallbackBase._dump_results at
# verbosity 0): the callback shows warnings and exceptions separately. Keys starting with _ansible are left out too.
_NOT_PRINTED = ("exception", "warnings", "deprecations", "invocation", "diff")
# PLAY RECAP's counters and the stats keys ansible-runner gives them under.
_RECAP_KEYS = {
    "ok": "ok",
    "changed": "changed",
    "unreachable": "dark",
    "failed": "failures",
    "skipped": "skipped",
    "rescued": "rescued",
    "ignored": "ignored",
}


class Run:
    """One finished ansible-runner run: rc, status ("successful", "failed", "timeout"...), output, events,
    stats, elapsed_s."""

    def __init__(self, runner, elapsed_s):
        self.rc = runner.rc
        self.status = runner.status
        self.output = runner.stdout.read()
        self.events = list(runner.events)
        self.stats = runner.stats or {}
        self.elapsed_s = elapsed_s

    def recap(self):
        """{host: {"ok", "changed", "unreachable", "failed", "skipped", "rescued", "ignored"}}: PLAY RECAP's counters."""
        hosts = set(self.stats.get("processed") or {})
        for key in _RECAP_KEYS.values():
            hosts.update(self.stats.get(key) or {})
        return {
            host: {name: (self.stats.get(key) or {}).get(host, 0) for name, key in _RECAP_KEYS.items()}
            for host in sorted(hosts)
        }

    def results(self):
        """{host: (status, result)} of the last task result per host: status SUCCESS, CHANGED, FAILED! or
        UNREACHABLE! (as `ansible -o` prints it), result the module's returned dict as `ansible -o` prints it."""
        found = {}
        for event in self.events:
            status = _RESULT_EVENTS.get(event.get("event"), "")
            if status == "":
                continue
            data = event["event_data"]
            result = {
                key: value
                for key, value in data.get("res", {}).items()
                if key not in _NOT_PRINTED and not key.startswith("_ansible")
            }
            if status is None:
                status = "CHANGED" if result.get("changed") else "SUCCESS"
            found[data["host"]] = (status, result)
        return found


def run(
    inventory, cwd, playbook=None, module=None, module_args=None, pattern="all", args=(), envvars=None, timeout=None
):
    """Run `playbook` (a path), or `module` ad hoc on `pattern`, with `inventory` and the extra command-line `args`.

    `envvars` are added to this process's environment (its PATH chooses the ansible-playbook or ansible that
    runs, see `environment`); `cwd` is the directory the run starts in (relative paths in ansible.cfg). Returns
    a Run. The runner's private directory is a temporary one, removed afterwards.
    """
    private = tempfile.mkdtemp(prefix="ansible-runner-")
    kwargs = dict(
        private_data_dir=private,
        project_dir=str(cwd),
        inventory=str(inventory),
        envvars=dict(envvars or {}),
        quiet=True,
        cmdline=" ".join(shlex.quote(str(arg)) for arg in args) or None,
        timeout=timeout,
    )
    if playbook is not None:
        kwargs["playbook"] = str(playbook)
    else:
        kwargs.update(host_pattern=pattern, module=module, module_args=module_args)
    started = time.monotonic()
    try:
        runner = ansible_runner.run(**kwargs)
        return Run(runner, round(time.monotonic() - started, 3))
    finally:
        shutil.rmtree(private, ignore_errors=True)


def environment(bin_dir, config):
    """Variables for a run with the ansible of `bin_dir` first on PATH and `config` as ansible.cfg, without colour
    and with the stdout callback that ansible.cfg names (ansible-runner wraps it)."""
    env = {
        "PATH": "%s:%s" % (bin_dir, os.environ.get("PATH", "")),
        "ANSIBLE_CONFIG": str(config),
        "ANSIBLE_NOCOLOR": "1",
        "ANSIBLE_FORCE_COLOR": "0",
    }
    if not any(os.environ.get(name) for name in ("LC_ALL", "LANG")):
        env["LANG"] = "C.UTF-8"  # ansible-core refuses a non-UTF-8 locale
    return env


def guard_rulebook(repo, work, inventory, port, token, remediate):
    """(argv, env) of ansible-rulebook running the shipped guard rulebook of `repo` (its .venv-eda) on `inventory`,
    its webhook on 127.0.0.1:`port` with Bearer `token`, its state and log (guard.jsonl) under `work`."""
    variables = {
        "guard_webhook_port": port,
        "guard_webhook_token": token,
        "guard_remediate": remediate,
        "guard_interval": 600,
        "guard_state_dir": str(work / "guard-state"),
        "guard_log": str(work / "guard.jsonl"),
    }
    (work / "guard-vars.yml").write_text(json.dumps(variables))
    argv = [str(repo / ".venv-eda" / "bin" / "ansible-rulebook"), "-i", str(inventory)]
    argv += ["--rulebook", "gpuops.nvidia.gpu_guard", "--vars", str(work / "guard-vars.yml"), "-v"]
    return argv, dict(os.environ, **environment(repo / ".venv" / "bin", repo / "ansible.cfg"))
