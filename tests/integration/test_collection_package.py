"""The collection as users get it: built tarball, ansible-galaxy install, FQCN playbook, ansible-doc."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from ansible_run import REPO, VENV_BIN
from nodetools import alive, start_holder
from simnode import inventory_file

MODULES = sorted(p[:-3] for p in os.listdir(REPO / "plugins" / "modules") if p.endswith(".py") and p != "__init__.py")
ROLES = sorted(os.listdir(REPO / "roles"))


def clean_env(collections_path):
    """Environment with only the installed copy of the collection visible (no ansible.cfg of this checkout)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["PATH"] = "%s:%s" % (VENV_BIN, env.get("PATH", ""))
    env["ANSIBLE_COLLECTIONS_PATH"] = str(collections_path)
    env["ANSIBLE_NOCOLOR"] = "1"
    env["ANSIBLE_FORCE_COLOR"] = "0"
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """Build the tarball and install it into an empty collections path; returns that path."""
    work = tmp_path_factory.mktemp("galaxy")
    build = subprocess.run(
        [VENV_BIN / "ansible-galaxy", "collection", "build", "--output-path", work, REPO],
        capture_output=True,
        text=True,
        cwd=work,
        check=False,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    [tarball] = [p for p in work.iterdir() if p.name.endswith(".tar.gz")]
    assert re.fullmatch(r"gpuops-nvidia-\d+\.\d+\.\d+\.tar\.gz", tarball.name)
    collections = work / "collections"
    install = subprocess.run(
        [VENV_BIN / "ansible-galaxy", "collection", "install", "-p", collections, tarball],
        capture_output=True,
        text=True,
        cwd=work,
        env=clean_env(collections),
        check=False,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    root = collections / "ansible_collections" / "gpuops" / "nvidia"
    assert (root / "plugins" / "modules" / "gpu_kill.py").is_file()
    assert not (root / "tests" / "sim" / "build").exists() and not (root / ".venv").exists()
    return collections


def test_installed_collection_runs_reset_playbook_by_fqcn(installed, simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.2)
    holder = start_holder(node, [0, 1], mib=2048)
    inventory = inventory_file(tmp_path, node)
    run = subprocess.run(
        [VENV_BIN / "ansible-playbook", "-i", inventory, "gpuops.nvidia.reset_gpus"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=clean_env(installed),
        timeout=300,
        check=False,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert re.search(r"%s\s+: ok=\d+\s+changed=1 " % re.escape(node.name), out), out
    assert (
        str(installed)
        in subprocess.run(
            [VENV_BIN / "ansible-galaxy", "collection", "list", "gpuops.nvidia"],
            capture_output=True,
            text=True,
            env=clean_env(installed),
            check=False,
        ).stdout
    )
    assert not alive(node, holder)


@pytest.mark.parametrize("module", MODULES)
def test_ansible_doc_renders_module(installed, module):
    doc = subprocess.run(
        [VENV_BIN / "ansible-doc", "gpuops.nvidia.%s" % module],
        capture_output=True,
        text=True,
        env=clean_env(installed),
        check=False,
    )
    assert doc.returncode == 0 and "gpuops.nvidia.%s" % module in doc.stdout, doc.stderr
    assert "EXAMPLES:" in doc.stdout and "RETURN VALUES:" in doc.stdout
    assert "gpuops" not in doc.stderr, doc.stderr


@pytest.mark.parametrize("role", ROLES)
def test_ansible_doc_renders_role(installed, role):
    doc = subprocess.run(
        [VENV_BIN / "ansible-doc", "-t", "role", "gpuops.nvidia.%s" % role],
        capture_output=True,
        text=True,
        env=clean_env(installed),
        check=False,
    )
    assert doc.returncode == 0 and re.search(r"ENTRY POINT: \W*main", doc.stdout), doc.stdout + doc.stderr
    assert role + "_" in doc.stdout  # the role's own variables are listed
    assert "gpuops" not in doc.stderr, doc.stderr
