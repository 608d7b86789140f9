"""playbooks/reset_gpus.yml driven by every supported ansible-core line as the controller.

meta/runtime.yml's requires_ansible and the README's "Supported versions" state what CONTROLLERS
tests. Each controller is a venv cached under .cache/controllers/ansible-core-<version>-py<X.Y>
(gitignored, reused across runs; about 15 s to make from PyPI, 70 MB). The modules still run in
the simulated node's interpreter (the repository's .venv): what varies is the controller, i.e.
the play and role engine, argument-spec validation, templating, and the module_utils each
ansible-core ships to the host inside its AnsiballZ payload. The .venv controller
(ansible-core 2.21 on Python 3.12) runs every other integration test.

A controller whose Python this machine lacks is skipped, and fails where the environment variable
CI is set (CONTRIBUTING.md, "Tests that skip").
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ansible_run import REPO, playbook
from nodetools import alive, gpu_memory, start_holder
from simnode import inventory_file

PLAYBOOK = REPO / "playbooks" / "reset_gpus.yml"
CACHE = REPO / ".cache" / "controllers"
PYENV_ROOT = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv"))

# (ansible-core release, controller Python), each line on one end of its controller Python range
# (2.17: 3.10-3.12; 2.18, 2.19: 3.11-3.13; 2.20, 2.21: 3.12-3.14). 2.21 on 3.12 is the .venv controller.
CONTROLLERS = [("2.17.14", "3.10"), ("2.18.19", "3.13"), ("2.19.14", "3.11"), ("2.20.10", "3.13"), ("2.21.5", "3.13")]


def find_python(version: str) -> str | None:
    """Path of a working python<version>: the newest $PYENV_ROOT/versions/<version>.N, else one on PATH.

    pyenv's shims are not used for versions other than the default one: they exit 127.
    """
    candidates = sorted(
        PYENV_ROOT.glob("versions/%s.*/bin/python%s" % (version, version)),
        key=lambda path: [int(part) for part in path.parts[-3].split(".") if part.isdigit()],
        reverse=True,
    )
    on_path = shutil.which("python%s" % version)
    for candidate in [str(path) for path in candidates] + ([on_path] if on_path else []):
        probe = subprocess.run(
            [candidate, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    return None


def controller_venv(core: str, python_version: str, python: str) -> Path:
    """bin/ directory of a venv of `python` (version `python_version`) with ansible-core==`core`, made once and cached.

    A lock serializes concurrent test runs; a stamp written last marks a complete venv, so an
    interrupted install is redone. Raises AssertionError with pip's output if the install fails.
    """
    venv = CACHE / ("ansible-core-%s-py%s" % (core, python_version))
    stamp = venv / "gpuops-controller.stamp"
    wanted = "ansible-core==%s %s" % (core, python)
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / (venv.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.is_file() or stamp.read_text() != wanted:
            shutil.rmtree(venv, ignore_errors=True)
            for command in (
                [python, "-m", "venv", str(venv)],
                [
                    str(venv / "bin" / "python"),
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "ansible-core==%s" % core,
                ],
            ):
                result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
                assert result.returncode == 0, "%s failed:\n%s%s" % (" ".join(command), result.stdout, result.stderr)
            stamp.write_text(wanted)
    return venv / "bin"


def test_runtime_and_readme_state_the_tested_controllers():
    oldest = min(CONTROLLERS, key=lambda cell: [int(part) for part in cell[0].split(".")])[0]
    runtime = yaml.safe_load((REPO / "meta" / "runtime.yml").read_text())
    assert runtime["requires_ansible"] == ">=%s.0" % ".".join(oldest.split(".")[:2])
    # README "Supported versions": rows "| 2.19 | 3.11 |" (more Pythons may follow the first).
    readme_rows = dict(re.findall(r"^\| (2\.\d+) \| (.+?) \|$", (REPO / "README.md").read_text(), re.M))
    tested = {}
    for core, python_version in CONTROLLERS:
        tested.setdefault(".".join(core.split(".")[:2]), []).append(python_version)
    assert sorted(readme_rows) == sorted(tested), readme_rows
    for line, python_versions in tested.items():
        assert all(version in readme_rows[line] for version in python_versions), (line, readme_rows[line])


@pytest.mark.parametrize("core, python_version", CONTROLLERS, ids=["core%s-py%s" % cell for cell in CONTROLLERS])
def test_reset_playbook_from_controller(simnode, tmp_path, core, python_version):
    python = find_python(python_version)
    if python is None:
        why = "no working python%s (looked under %s/versions and on PATH)" % (python_version, PYENV_ROOT)
        if os.environ.get("CI"):
            pytest.fail("%s: CI must run every controller of the README's table" % why)
        pytest.skip("%s; CONTRIBUTING.md, 'Tests that skip'" % why)
    bin_dir = controller_venv(core, python_version, python)
    version = subprocess.run(
        [bin_dir / "ansible-playbook", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert (
        re.search(r"\[core %s\]" % re.escape(core), version) and "python version = %s." % python_version in version
    ), version

    node = simnode(gpus=2, release_latency=0.2)
    holder = start_holder(node, [0, 1], mib=2048, title="VLLM::EngineCore")
    inventory = inventory_file(tmp_path, node)

    rc, out, recap = playbook(inventory, PLAYBOOK, bin_dir=bin_dir)
    assert rc == 0 and recap[node.name]["changed"] == 1 and recap[node.name]["failed"] == 0, out
    assert not alive(node, holder)
    assert all(used <= 256 and not pids for used, pids in gpu_memory(node))
    assert "GPU 1 NVIDIA H100 80GB HBM3: 2048 -> 0 MiB used" in out, out

    rc, out, recap = playbook(inventory, PLAYBOOK, bin_dir=bin_dir)
    assert rc == 0 and recap[node.name]["changed"] == 0, out
