# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run the collection's modules and playbooks through ansible-playbook against localhost, as an operator would.

Ansible is run through tests/ansible_api.py (ansible-runner: results from its events and stats, the
one helper the other tests use too; check.py puts tests/ on sys.path, which is there in any checkout
the check runs from). The ansible-playbook it starts is a wrapper running `python -m ansible
playbook` with the check's own interpreter, so the ansible-core that run.sh installed from wheels
(on PYTHONPATH) is the one used. Everything Ansible
writes goes into a private work directory: ansible.cfg, the inventory (localhost,
ansible_connection=local, ansible_python_interpreter = this interpreter), ANSIBLE_HOME, and
collections/ansible_collections/gpuops/nvidia, a link to this checkout.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys


class Ansible:
    """Ansible against localhost from `workdir` (created if needed) for the collection at `repo`.

    module(name, args, timeout, check_mode) and playbook(path, extra_vars, timeout) return dicts (see each).
    """

    def __init__(self, repo, workdir, python=sys.executable):
        # Imported here, not at the top: check.py --probe and --missing-packages run before run.sh has installed
        # ansible-runner.
        import ansible_api  # pylint: disable=import-outside-toplevel

        self.api = ansible_api
        self.repo = repo
        self.workdir = workdir
        self.python = python
        self._runs = 0
        namespace_dir = os.path.join(workdir, "collections", "ansible_collections", "gpuops")
        os.makedirs(namespace_dir, exist_ok=True)
        link = os.path.join(namespace_dir, "nvidia")
        if not os.path.islink(link):
            os.symlink(repo, link)
        self.inventory = os.path.join(workdir, "inventory.ini")
        with open(self.inventory, "w") as inventory:
            inventory.write("localhost ansible_connection=local ansible_python_interpreter=%s\n" % python)
        config = os.path.join(workdir, "ansible.cfg")
        with open(config, "w") as cfg:
            cfg.write(
                "[defaults]\ncollections_path = %s\ninventory = %s\nstdout_callback = default\n"
                "retry_files_enabled = false\nhost_key_checking = false\nremote_tmp = %s\nlocal_tmp = %s\n"
                % (
                    os.path.join(workdir, "collections"),
                    self.inventory,
                    os.path.join(workdir, "remote-tmp"),
                    os.path.join(workdir, "local-tmp"),
                )
            )
        bin_dir = os.path.join(workdir, "bin")
        os.makedirs(bin_dir, exist_ok=True)
        wrapper = os.path.join(bin_dir, "ansible-playbook")
        with open(wrapper, "w") as script:
            script.write("#!/bin/sh\nexec %s -m ansible playbook \"$@\"\n" % shlex.quote(python))
        os.chmod(wrapper, 0o755)
        self.env = dict(
            self.api.environment(bin_dir, config),
            ANSIBLE_HOME=os.path.join(workdir, "home"),
            ANSIBLE_COLLECTIONS_PATH=os.path.join(workdir, "collections"),
        )

    def version(self):
        """ansible-core's version string, as the interpreter running Ansible imports it."""
        return subprocess.run(
            [self.python, "-c", "from ansible.release import __version__; print(__version__)"],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, **self.env),
        ).stdout.strip()

    def module(self, name, args=None, timeout=120.0, check_mode=False):
        """Run module `name` on localhost through ansible-playbook (a generated one-task play that
        registers the result and writes it to a JSON file).

        Returns {"status" ("SUCCESS", "CHANGED", "FAILED", or None when the play produced no result),
        "result" (the registered result, or {}), "rc", "elapsed_s", "output" (last 3,000 characters)}.
        """
        self._runs += 1
        result_path = os.path.join(self.workdir, "result-%d.json" % self._runs)
        play_path = os.path.join(self.workdir, "play-%d.yml" % self._runs)
        task = {
            "name": "Run %s" % name,
            name: args or {},
            "register": "gpucheck_result",
            "ignore_errors": True,
            "check_mode": check_mode,
        }
        save = {
            "name": "Save the result",
            "check_mode": False,
            "ansible.builtin.copy": {"content": "{{ gpucheck_result | to_json }}", "dest": result_path, "mode": "0600"},
        }
        with open(play_path, "w") as play:
            json.dump(
                [{"name": "gpu check: %s" % name, "hosts": "localhost", "gather_facts": False, "tasks": [task, save]}],
                play,
                indent=1,
            )
        run = self.playbook(play_path, timeout=timeout)
        try:
            with open(result_path) as saved:
                result = json.load(saved)
        except (OSError, ValueError):
            result = None
        if result is None:
            status = None
        elif result.get("failed"):
            status = "FAILED"
        else:
            status = "CHANGED" if result.get("changed") else "SUCCESS"
        return {
            "status": status,
            "result": result or {},
            "rc": run["rc"],
            "elapsed_s": run["elapsed_s"],
            "output": run["output"][-3000:],
        }

    def playbook(self, path, extra_vars=None, timeout=300.0, check=False):
        """Run ansible-playbook `path` on localhost with `extra_vars` (a dict, passed as JSON); `check`: --check.

        Returns {"rc", "recap" (localhost's counters or None), "elapsed_s", "output" (last 6,000 characters),
        "results" ({module name: the last result of a task running it, as its event gave it})}.
        """
        args = ["-e", json.dumps(extra_vars)] if extra_vars else []
        run = self.api.run(
            self.inventory,
            self.repo,
            playbook=path,
            args=args + (["--check"] if check else []),
            envvars=self.env,
            timeout=timeout,
        )
        return {
            "rc": run.rc,
            "recap": run.recap().get("localhost"),
            "elapsed_s": run.elapsed_s,
            "output": run.output[-6000:],
            "results": module_results(run.events),
        }


def module_results(events):
    """{module name (task_action, e.g. "gpuops.nvidia.gpu_kill"): the result (event_data "res") of the last task that
    ran it} from ansible-runner events; failed tasks count too (check_gpus fails when a GPU is not free)."""
    found = {}
    for event in events:
        if event.get("event") not in ("runner_on_ok", "runner_on_failed"):
            continue
        data = event.get("event_data") or {}
        if data.get("task_action"):
            found[data["task_action"]] = data.get("res") or {}
    return found
