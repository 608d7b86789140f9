"""execution-environment.yml: `ansible-builder create` makes a build context (no image is built here).

The steps of the image build that need no container are run against that context: the galaxy
stage's `ansible-galaxy collection install -r requirements.yml`, and ansible-builder's own
introspection of the installed collection, which yields the Python and system packages the image
gets.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml
from ansible.release import __version__ as tested_ansible_core

from ansible_run import REPO, VENV_BIN

DEFINITION_FILES = ("execution-environment.yml", "requirements.txt", "bindep.txt")


def run(command, **kwargs):
    """Run `command` (output captured); fail the test with its output if it exits non-zero."""
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True, check=False, **kwargs)
    assert result.returncode == 0, "%s\n%s%s" % (" ".join(str(part) for part in command), result.stdout, result.stderr)
    return result


@pytest.fixture(scope="module")
def ee(tmp_path_factory):
    """(definition directory, build context) of `ansible-builder create`, with the collection tarball
    built from this checkout beside the definition, where execution-environment.yml expects it."""
    work = tmp_path_factory.mktemp("ee")
    definition = work / "definition"
    definition.mkdir()
    for name in DEFINITION_FILES:
        shutil.copy(REPO / name, definition / name)
    run([VENV_BIN / "ansible-galaxy", "collection", "build", "--output-path", definition, REPO], cwd=work)
    context = work / "context"
    run(
        [
            VENV_BIN / "ansible-builder",
            "create",
            "--file",
            definition / "execution-environment.yml",
            "--context",
            context,
            "--output-filename",
            "Containerfile",
        ],
        cwd=work,
    )
    return definition, context


def test_containerfile_builds_on_the_tested_controller(ee):
    _definition, context = ee
    containerfile = (context / "Containerfile").read_text()
    assert 'ARG EE_BASE_IMAGE="quay.io/centos/centos:stream9"' in containerfile
    assert 'ARG PYCMD="/usr/bin/python3.12"' in containerfile
    # The image's controller is the one every integration test runs (.venv).
    assert 'ARG ANSIBLE_INSTALL_REFS="ansible-core==%s ansible-runner==' % tested_ansible_core in containerfile
    assert "ansible-galaxy collection install $ANSIBLE_GALAXY_CLI_COLLECTION_OPTS -r requirements.yml" in containerfile
    assert "introspect.py introspect --user-pip=requirements.txt --user-bindep=bindep.txt" in containerfile
    for name in DEFINITION_FILES[1:]:
        assert (context / "_build" / name).read_text() == (REPO / name).read_text()


def test_context_installs_the_collection_and_yields_its_requirements(ee, tmp_path):
    _definition, context = ee
    build = context / "_build"  # /build in the image, the galaxy and builder stages' working directory
    galaxy = yaml.safe_load((REPO / "galaxy.yml").read_text())
    tarball = "gpuops-nvidia-%s.tar.gz" % galaxy["version"]
    assert (build / "collection" / tarball).is_file(), (
        "execution-environment.yml must name %s (galaxy.yml's version)" % tarball
    )
    collections = tmp_path / "collections"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env["ANSIBLE_GALAXY_DISABLE_GPG_VERIFY"] = "1"
    run(
        [
            VENV_BIN / "ansible-galaxy",
            "collection",
            "install",
            "-r",
            "requirements.yml",
            "--collections-path",
            collections,
        ],
        cwd=build,
        env=env,
    )
    manifest = json.loads((collections / "ansible_collections" / "gpuops" / "nvidia" / "MANIFEST.json").read_text())
    assert manifest["collection_info"]["version"] == galaxy["version"]

    out = tmp_path / "introspected"
    run(
        [
            VENV_BIN / "python",
            build / "scripts" / "introspect.py",
            "introspect",
            "--user-pip=requirements.txt",
            "--user-bindep=bindep.txt",
            "--write-pip=%s" % (out / "requirements.txt"),
            "--write-bindep=%s" % (out / "bindep.txt"),
            collections,
        ],
        cwd=build,
    )
    python_packages = (out / "requirements.txt").read_text().splitlines()
    system_packages = (out / "bindep.txt").read_text().splitlines()
    # Found in the installed collection itself, as for any EE that lists gpuops.nvidia.
    for line in (
        "nvidia-ml-py>=12.535.108  # from collection gpuops.nvidia",
        "psutil>=5.9  # from collection gpuops.nvidia",
    ):
        assert line in python_packages, python_packages
    assert "openssh-clients [platform:rpm]  # from collection gpuops.nvidia" in system_packages, system_packages


def test_tarball_holds_nothing_git_ignores(ee):
    definition, _context = ee
    [tarball] = definition.glob("gpuops-nvidia-*.tar.gz")
    members = run(["tar", "-tzf", tarball]).stdout.split()
    files = [name for name in members if not name.endswith("/") and name not in ("MANIFEST.json", "FILES.json")]
    ignored = subprocess.run(
        ["git", "-C", REPO, "check-ignore", "--stdin"],
        input="\n".join(files),
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    assert files and not ignored, "add to galaxy.yml's build_ignore: %s" % ignored
