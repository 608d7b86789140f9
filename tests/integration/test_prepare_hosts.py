"""playbooks/prepare_hosts.yml on a node reached over SSH whose interpreter is this machine's /usr/bin/python3.

That Python is externally managed (Debian 12, PEP 668) and has neither nvidia-ml-py nor psutil: the README's old
first step (pip into it) fails there. It is read-only for these tests: nothing may be installed into it. The node
shares this machine's filesystem, so the venv goes under the test's tmp_path (gpuops_nvidia_venv in the inventory),
and the node has no network to the package index: the wheels come from a directory on the controller
(prepare_hosts_wheels_dir), downloaded once into .cache/prepare-hosts-wheels/ for the system Python's version.
"""

from __future__ import annotations

import fcntl
import json
import re
import shutil
import subprocess

import pytest

from ansible_run import REPO, VENV_BIN, module, only, playbook
from nodetools import alive, gpu_memory, start_holder
from ports import free_ports
from simnode import inventory_file

PREPARE = REPO / "playbooks" / "prepare_hosts.yml"
RESET = REPO / "playbooks" / "reset_gpus.yml"
CHECK = REPO / "playbooks" / "check_gpus.yml"
ENSURE_TOOLS = REPO / "scripts" / "bench" / "ensure_tools.sh"
SYSTEM_PYTHON = "/usr/bin/python3"
WHEELS = REPO / ".cache" / "prepare-hosts-wheels"
REQUIREMENTS = [
    line for line in (REPO / "requirements.txt").read_text().splitlines() if line and not line.startswith("#")
]
# What the system Python has installed: every distribution's name and version.
DISTRIBUTIONS = "import importlib.metadata as m; print(sorted('%s %s' % (d.metadata['Name'], d.version) for d in m.distributions()))"


def system_python_version() -> str:
    return subprocess.run(
        [SYSTEM_PYTHON, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


@pytest.fixture(scope="module")
def wheels():
    """Directory of wheels of requirements.txt for the system Python (pip download, once; reused across runs).

    A lock serializes test processes (pytest-xdist workers) that need it at once; a stamp written last marks a
    complete download, so one that was interrupted, or is still running in another process, is never used."""
    version = system_python_version()
    directory = WHEELS / ("py" + version)
    stamp = directory / "gpuops-wheels.stamp"
    WHEELS.mkdir(parents=True, exist_ok=True)
    with open(WHEELS / ("py%s.lock" % version), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.is_file() or stamp.read_text() != "\n".join(REQUIREMENTS):
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            result = subprocess.run(
                [
                    str(VENV_BIN / "pip"),
                    "download",
                    "--quiet",
                    "--disable-pip-version-check",
                    "--only-binary=:all:",
                    "--python-version",
                    version,
                    "--platform",
                    "manylinux2014_x86_64",
                    "--platform",
                    "manylinux_2_28_x86_64",
                    "-d",
                    str(directory),
                    *REQUIREMENTS,
                ],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert result.returncode == 0, "pip download of %s failed:\n%s" % (REQUIREMENTS, result.stderr)
            stamp.write_text("\n".join(REQUIREMENTS))
    return directory


@pytest.fixture
def ssh_node(simnode, tmp_path):
    """An SSH-reached node and its inventory with ansible_python_interpreter=/usr/bin/python3 and the venv in tmp_path."""
    result = subprocess.run([str(ENSURE_TOOLS), "sshd"], capture_output=True, text=True, timeout=600, check=False)
    if result.returncode != 0:
        pytest.skip(result.stderr.strip() or "ensure_tools.sh sshd failed")
    node = simnode(ssh=True, gpus=2, release_latency=0.2)
    inventory = inventory_file(tmp_path, node)
    text = re.sub(
        r"ansible_python_interpreter=\S+", "ansible_python_interpreter=%s" % SYSTEM_PYTHON, inventory.read_text()
    )
    text = re.sub(r" gpuops_nvidia_venv=\S+", "", text)
    venv = tmp_path / "gpuops-nvidia" / "venv"
    header, host_line = text.splitlines()
    inventory.write_text("%s\n%s gpuops_nvidia_venv=%s\n" % (header, host_line, venv))
    assert (
        "ansible_python_interpreter=%s" % SYSTEM_PYTHON in inventory.read_text() and str(venv) in inventory.read_text()
    )
    return node, inventory, venv


def on_node(node, *command):
    """Run `command` in the node over its own sshd's namespaces (as the SSH sessions see it); return the result."""
    return node.exec(*command, check=False)


def system_python_state(node):
    """(distributions of the system Python, whether `import psutil` and `import pynvml` fail there)."""
    listing = on_node(node, SYSTEM_PYTHON, "-c", DISTRIBUTIONS)
    assert listing.returncode == 0, listing.stderr
    imports = [on_node(node, SYSTEM_PYTHON, "-c", "import %s" % name).returncode != 0 for name in ("psutil", "pynvml")]
    return listing.stdout, imports


def test_prepare_hosts_makes_the_venv_once_and_the_collection_uses_it(ssh_node, wheels, tmp_path):
    node, inventory, venv = ssh_node
    before = system_python_state(node)
    assert before[1] == [True, True], "the system Python must lack psutil and pynvml for this test"
    offline = ("-e", "prepare_hosts_wheels_dir=%s" % wheels)

    # Check mode: says what it would do, creates nothing.
    rc, out, recap = playbook(inventory, PREPARE, "-b", "--check", *offline)
    assert rc == 0 and recap[node.name]["failed"] == 0, out
    assert (
        "prepare_hosts (check mode): would make %s with %s -m venv; would install %s from the 2 wheel(s) of %s"
        % (venv, SYSTEM_PYTHON, ", ".join(REQUIREMENTS), wheels)
        in out
    ), out
    assert recap[node.name]["changed"] > 0 and not venv.parent.exists(), out

    rc, out, recap = playbook(inventory, PREPARE, "-b", *offline)
    assert rc == 0 and recap[node.name]["changed"] > 0, out
    assert re.search(
        r"prepare_hosts: %s ready: nvidia-ml-py \d+\.\d+\.\d+, psutil \d+\.\d+" % re.escape(str(venv)), out
    ), out
    assert (venv / "bin" / "python").exists() and not (venv / "wheels").exists()
    config = dict(line.split(" = ", 1) for line in (venv / "pyvenv.cfg").read_text().splitlines() if " = " in line)
    assert config["home"] == "/usr/bin", config  # made by the system Python's own venv

    rc, out, recap = playbook(inventory, PREPARE, "-b", *offline)
    assert rc == 0 and recap[node.name]["changed"] == 0, out
    assert "prepare_hosts: nothing to do: %s has nvidia-ml-py" % venv in out, out
    rc, out, recap = playbook(inventory, PREPARE, "-b", "--check", *offline)
    assert rc == 0 and recap[node.name]["changed"] == 0, out

    # The collection's playbooks run their modules with the venv's Python: the system Python has neither library.
    holder = start_holder(node, [0, 1], mib=2048, title="VLLM::EngineCore")
    rc, out, recap = playbook(inventory, CHECK)
    assert rc != 0 and "check_gpus %s: not free" % node.name in out, out
    rc, out, recap = playbook(inventory, RESET, "-b")
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert not alive(node, holder) and all(used <= 256 and not pids for used, pids in gpu_memory(node))
    rc, out, recap = playbook(inventory, CHECK)
    assert rc == 0 and "check_gpus %s: GPUs free (2 checked)" % node.name in out, out

    assert system_python_state(node) == before  # no new package, psutil and pynvml still missing

    # The venv's base Python gone (as after a distribution upgrade): the venv is made again.
    (venv / "bin" / "python").unlink()
    (venv / "bin" / "python").symlink_to("/usr/bin/python3.0-gone")
    rc, out, recap = playbook(inventory, PREPARE, "-b", *offline)
    assert rc == 0 and "%s/bin/python does not run: the venv is made again" % venv in out, out
    assert "prepare_hosts: %s ready: nvidia-ml-py" % venv in out and (venv / "bin" / "python").resolve().exists(), out


def test_the_users_own_tasks_keep_their_interpreter(ssh_node, wheels, tmp_path):
    node, inventory, venv = ssh_node
    rc, out, _recap = playbook(inventory, PREPARE, "-b", "-e", "prepare_hosts_wheels_dir=%s" % wheels)
    assert rc == 0, out
    play = tmp_path / "mixed.yml"
    play.write_text("""
- hosts: all
  gather_facts: false
  tasks:
    - gpuops.nvidia.gpu_facts:
      register: facts
    - ansible.builtin.setup:
        gather_subset: ["!all", "!min", "python"]
    - ansible.builtin.debug:
        msg: >-
          user task Python {{ ansible_facts.python.executable }};
          discovered {{ ansible_facts.discovered_interpreter_python | default('none') }};
          GPUs {{ ansible_facts.nvidia.gpus | length }} (driver {{ ansible_facts.nvidia.driver.available }})
""")
    rc, out, _recap = playbook(inventory, play)
    assert rc == 0 and "user task Python %s; discovered none; GPUs 2 (driver True)" % SYSTEM_PYTHON in out, out
    # An ad hoc run finds the venv as well (docs/prepare_hosts.md).
    status, result = only(module(inventory, "gpuops.nvidia.gpu_facts"))
    assert status == "SUCCESS" and len(result["ansible_facts"]["nvidia"]["gpus"]) == 2, result


def test_a_host_with_neither_python_gets_one_message_and_the_next_step(ssh_node):
    node, inventory, venv = ssh_node
    assert not venv.exists()
    rc, out, recap = playbook(inventory, CHECK)
    assert rc != 0 and recap[node.name]["failed"] == 1, out
    assert (
        "no Python with nvidia-ml-py and psutil for gpuops.nvidia on this host; tried %s/bin/python (gpuops_nvidia_venv): "
        "not found; then %s (ansible_python_interpreter): lacks nvidia-ml-py. Next step: ansible-playbook -i INVENTORY "
        "gpuops.nvidia.prepare_hosts -b" % (venv, SYSTEM_PYTHON)
    ) in out, out
    assert "check_gpus %s: failed to check" % node.name in out or "check_gpus summary: 1 host(s): 1 failed" in out, out

    # A host whose Python already has both libraries (the repository's .venv here) needs nothing.
    rc, out, recap = playbook(inventory, PREPARE, "-b", "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python"))
    assert rc == 0 and recap[node.name]["changed"] == 0 and not venv.parent.exists(), out
    assert "prepare_hosts: nothing to do: %s has nvidia-ml-py" % (VENV_BIN / "python") in out, out


def test_a_failed_install_leaves_no_half_venv_behind(ssh_node):
    # Issue 33 item 14: with the package index unreachable, python3 -m venv made the venv and pip then failed. The
    # venv, without a library, was tried first by every module afterwards ("lacks nvidia-ml-py"), even with a task
    # interpreter that has both. The failed run now removes it and says so.
    node, inventory, venv = ssh_node
    index = "http://127.0.0.1:%d/simple" % free_ports(1)[0]  # reserved, nothing listens: unreachable
    unreachable = {"prepare_hosts_pip_extra_args": "--index-url %s --retries 0 --timeout 2" % index}
    rc, out, recap = playbook(inventory, PREPARE, "-b", "-e", json.dumps(unreachable))
    assert rc != 0 and recap[node.name]["failed"] == 1, out
    # This machine's pip.conf may add an index of its own (psutil, say): what is missing is nvidia-ml-py at least.
    assert re.search(
        r"%s was removed: the failed install left it without nvidia-ml-py(, psutil)?, and the modules would have "
        r"tried it first\. They use the task's interpreter until prepare_hosts succeeds" % re.escape(str(venv)),
        out.replace("\\n", " "),
    ), out
    assert "prepare_hosts: Make the venv with the host's python3 -m venv and install the libraries into it: " in out
    assert not venv.exists()
    # A task interpreter with both libraries (the repository's venv) now runs the modules.
    rc, out, recap = playbook(inventory, CHECK, "-e", "ansible_python_interpreter=%s" % (VENV_BIN / "python"))
    assert rc == 0 and "check_gpus %s: GPUs free (2 checked)" % node.name in out, out
