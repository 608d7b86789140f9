"""Run ansible / ansible-playbook from this checkout against simulated nodes, as an operator would."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"


def _env(bin_dir=VENV_BIN):
    env = dict(os.environ)
    env["PATH"] = "%s:%s" % (bin_dir, env.get("PATH", ""))
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["ANSIBLE_NOCOLOR"] = "1"
    env.pop("ANSIBLE_STDOUT_CALLBACK", None)
    return env


def module(inventory, name, args=None, check=False, timeout=120):
    """Run module `name` ad hoc on every host of `inventory`.

    Returns {host: (status, result)} with status SUCCESS, CHANGED or FAILED! and the module's JSON result.
    """
    cmd = ["ansible", "-o", "-i", str(inventory), "all", "-m", name]
    if args:
        cmd += ["-a", json.dumps(args)]
    if check:
        cmd.append("--check")
    proc = subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout, check=False)
    results = {}
    for line in proc.stdout.splitlines():
        match = re.match(r"^(\S+) \| (SUCCESS|CHANGED|FAILED!) => (\{.*\})$", line)
        if match:
            results[match.group(1)] = (match.group(2), json.loads(match.group(3)))
    assert results, "no result from ansible:\nstdout:\n%s\nstderr:\n%s" % (proc.stdout, proc.stderr)
    return results


def only(results):
    """The (status, result) of the single host in `results`."""
    assert len(results) == 1, results
    return next(iter(results.values()))


def playbook(inventory, path, *args, timeout=300, bin_dir=VENV_BIN):
    """Run ansible-playbook from `bin_dir` (default: .venv's controller); return (returncode, output, {host: recap counters})."""
    cmd = [str(Path(bin_dir) / "ansible-playbook"), "-i", str(inventory), str(path)] + list(args)
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=_env(bin_dir), capture_output=True, text=True, timeout=timeout, check=False)
    output = proc.stdout + proc.stderr
    recap = {}
    for match in re.finditer(r"^(\S+)\s+: ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", output, re.M):
        recap[match.group(1)] = {"ok": int(match.group(2)), "changed": int(match.group(3)),
                                 "unreachable": int(match.group(4)), "failed": int(match.group(5))}
    playbook.last_seconds = time.monotonic() - started
    return proc.returncode, output, recap
