# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the prepare_hosts role decides from a host's probe (plugins/filter/prepare_hosts/prepare_hosts.py), and probe.py itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.filter.prepare_hosts.prepare_hosts import (
    prepare_hosts_after_failure,
    prepare_hosts_plan,
    prepare_hosts_wheels,
)

ROLE = Path(__file__).resolve().parents[4] / "roles" / "prepare_hosts"
REQUIREMENTS = ["nvidia-ml-py>=12.535.108", "psutil>=5.9"]
VENV = "/opt/gpuops-nvidia/venv"


def python(path, nvml=None, psutil=None, packaging=True, version="3.11.2"):
    return {
        "path": path,
        "exists": True,
        "executable": path,
        "version": version,
        "nvidia-ml-py": nvml,
        "psutil": psutil,
        "packaging": packaging,
    }


def probe(venv=None, fallback=None, ensurepip=True, os_id="debian", id_like=(), version="3.11.2", rc=0, venv_dir=None):
    found = {
        "venv_dir": venv_dir or {"exists": False},
        "python": {"executable": "/usr/bin/python3", "version": version, "ensurepip": ensurepip},
        "os": {"id": os_id, "id_like": list(id_like)},
        "venv": venv or {"path": VENV + "/bin/python", "exists": False},
        "interpreters": [fallback or python("/usr/bin/python3")],
    }
    return {"rc": rc, "stdout": json.dumps(found) + "\n", "stderr": "", "cmd": ["python3", "-c", "..."]}


def plan(registered, **options):
    return prepare_hosts_plan(registered, VENV, REQUIREMENTS, **options)


def test_a_venv_at_the_floor_needs_nothing_and_one_below_it_is_upgraded():
    ready = plan(probe(venv=python(VENV + "/bin/python", "12.535.108", "5.9.0")))
    assert ready["ready"] and not ready["install"] and ready["error"] is None
    assert ready["line"] == "prepare_hosts: nothing to do: %s has nvidia-ml-py 12.535.108, psutil 5.9.0" % VENV
    # 12.535.77 misread the v3 process lists (requirements.txt): below the floor.
    old = plan(probe(venv=python(VENV + "/bin/python", "12.535.77", "7.0.0")))
    assert old["install"] and old["line"].endswith("(%s/bin/python lacks nvidia-ml-py>=12.535.108)" % VENV), old


def test_a_host_python_with_both_libraries_needs_nothing_while_there_is_no_venv():
    result = plan(probe(fallback=python("/srv/py/bin/python", "13.580.82", "7.2.2")))
    assert result["ready"] and not result["install"]
    assert result["line"] == (
        "prepare_hosts: nothing to do: /srv/py/bin/python has nvidia-ml-py 13.580.82, psutil 7.2.2 "
        "(the modules use it while %s does not exist)" % VENV
    )
    # pynvml from the old pynvml project has no nvidia-ml-py version: not at the floor.
    assert plan(probe(fallback=python("/usr/bin/python3", "unknown", "7.2.2")))["install"]


def test_debian_without_python3_venv_gets_it_from_apt_first_and_check_mode_says_would():
    result = plan(probe(ensurepip=False), check_mode=True)
    assert result["install"] and result["package_manager"] == "apt" and result["packages"] == ["python3-venv"]
    assert result["line"] == (
        "prepare_hosts (check mode): would install python3-venv (apt); would make %s with /usr/bin/python3 "
        "-m venv; would install nvidia-ml-py>=12.535.108, psutil>=5.9 from the package index "
        "(/usr/bin/python3 lacks nvidia-ml-py>=12.535.108, psutil>=5.9)" % VENV
    )


def test_the_pip_modules_requirement_parser_comes_from_dnf_on_the_red_hat_family():
    result = plan(
        probe(
            fallback=python("/usr/bin/python3", packaging=False), os_id="rocky", id_like=["rhel", "centos", "fedora"]
        ),
        wheels=["/w/a.whl", "/w/b.whl"],
        wheels_dir="/w",
    )
    assert result["package_manager"] == "dnf" and result["packages"] == ["python3-packaging"]
    assert "install nvidia-ml-py>=12.535.108, psutil>=5.9 from the 2 wheel(s) of /w" in result["line"]


def test_hosts_that_cannot_get_the_venv_get_a_reason_and_install_nothing():
    unknown = plan(probe(ensurepip=False, os_id="alpine"))
    assert (
        not unknown["install"]
        and "lacks ensurepip and /etc/os-release names no Debian or Red Hat family" in unknown["error"]
    )
    old = plan(probe(version="3.8.10"))
    assert not old["install"] and old["error"] == (
        "/usr/bin/python3 is Python 3.8.10; the modules need 3.9 or newer: set prepare_hosts_python to a newer one"
    )
    missing = plan(
        {"rc": 2, "stdout": "", "stderr": "[Errno 2] No such file or directory: b'python3'", "cmd": ["python3"]}
    )
    assert not missing["install"] and missing["error"].startswith(
        "could not run python3 on the host ([Errno 2] No such file"
    )


def test_verify_reports_the_installed_versions_or_what_is_still_lacking():
    done = plan(probe(venv=python(VENV + "/bin/python", "13.615.71", "7.2.2")), verify=True)
    assert done["ready"] and done["line"] == "prepare_hosts: %s ready: nvidia-ml-py 13.615.71, psutil 7.2.2" % VENV
    broken = plan(probe(venv=python(VENV + "/bin/python", "13.615.71", None)), verify=True)
    assert not broken["ready"] and broken["error"].startswith(
        "after the install %s/bin/python still lacks psutil>=5.9" % VENV
    )


def test_wheels_directory_must_hold_a_wheel_of_every_requirement(tmp_path):
    with pytest.raises(AnsibleFilterError, match="is not a directory on the controller"):
        prepare_hosts_wheels(str(tmp_path / "none"), REQUIREMENTS)
    (tmp_path / "nvidia_ml_py-13.615.71-py3-none-any.whl").write_text("")
    with pytest.raises(AnsibleFilterError, match="has no wheel of psutil"):
        prepare_hosts_wheels(str(tmp_path), REQUIREMENTS)
    (
        tmp_path / "psutil-7.2.2-cp36-abi3-manylinux2010_x86_64.manylinux_2_12_x86_64.manylinux_2_28_x86_64.whl"
    ).write_text("")
    (tmp_path / "README").write_text("")
    assert [Path(path).name for path in prepare_hosts_wheels(str(tmp_path), REQUIREMENTS)] == sorted(
        path.name for path in tmp_path.glob("*.whl")
    )


def test_probe_reads_a_python_and_reports_what_it_has(tmp_path):
    code = (ROLE / "files" / "probe.py").read_text()
    output = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "venv"), sys.executable, str(tmp_path / "no-python")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = json.loads(output)
    assert found["venv"] == {"path": str(tmp_path / "venv" / "bin" / "python"), "exists": False}
    this, missing = found["interpreters"]
    assert this["path"] == sys.executable and this["nvidia-ml-py"] and this["psutil"] and this["packaging"] is True
    assert missing == {"path": str(tmp_path / "no-python"), "exists": False}
    assert found["python"]["executable"] == sys.executable and isinstance(found["python"]["ensurepip"], bool)


def test_the_roles_floors_are_those_of_requirements_txt():
    import yaml

    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    spec = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    wanted = [
        line
        for line in (ROLE.parents[1] / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert defaults["prepare_hosts_requirements"] == spec["prepare_hosts_requirements"]["default"] == wanted


def test_a_venv_whose_python_no_longer_runs_is_made_again_and_a_directory_that_is_no_venv_is_refused():
    dangling = plan(probe(venv_dir={"exists": True, "pyvenv_cfg": True, "entries": ["bin", "lib", "pyvenv.cfg"]}))
    assert (
        dangling["install"]
        and dangling["remake"]
        and dangling["line"].endswith("(%s/bin/python does not run: the venv is made again)" % VENV)
    ), dangling
    broken = plan(
        probe(
            venv={"path": VENV + "/bin/python", "exists": True, "error": "libpython3.11.so.1.0: cannot open"},
            venv_dir={"exists": True, "pyvenv_cfg": True, "entries": ["bin"]},
        )
    )
    assert broken["remake"]
    other = plan(probe(venv_dir={"exists": True, "pyvenv_cfg": False, "entries": ["data", "models"]}))
    assert (
        not other["install"]
        and not other["remake"]
        and other["error"]
        == (
            "%s exists and is not a venv (no pyvenv.cfg; it holds data, models): set gpuops_nvidia_venv to a new path"
            % VENV
        )
    )
    # What an interrupted run leaves (the copied wheels only) is no reason to refuse.
    assert plan(probe(venv_dir={"exists": True, "pyvenv_cfg": False, "entries": ["wheels"]}))["install"]


def test_a_failed_install_leaves_no_venv_that_lacks_a_library():
    # Issue 33 item 14: pip unreachable left a venv with psutil and no nvidia-ml-py, which the modules then tried first.
    venv_dir = {"exists": True, "pyvenv_cfg": True, "entries": ["bin", "lib", "pyvenv.cfg"]}
    half = prepare_hosts_after_failure(
        probe(venv=python(VENV + "/bin/python", None, "7.0.0"), venv_dir=venv_dir), VENV, REQUIREMENTS
    )
    assert half == {
        "remove": True,
        "line": "%s was removed: the failed install left it without nvidia-ml-py, and the modules would have tried it "
        "first. They use the task's interpreter until prepare_hosts succeeds" % VENV,
    }
    broken = prepare_hosts_after_failure(
        probe(venv={"path": VENV + "/bin/python", "exists": True, "error": "No such file"}, venv_dir=venv_dir),
        VENV,
        REQUIREMENTS,
    )
    assert broken["remove"] and "without nvidia-ml-py, psutil" in broken["line"], broken
    # Both libraries there, one below its floor: the venv the modules ran with before is kept.
    old = prepare_hosts_after_failure(
        probe(venv=python(VENV + "/bin/python", "12.535.77", "7.0.0"), venv_dir=venv_dir), VENV, REQUIREMENTS
    )
    assert old == {"remove": False, "line": "%s is kept as it was: it has nvidia-ml-py 12.535.77, psutil 7.0.0" % VENV}
    none = prepare_hosts_after_failure(probe(), VENV, REQUIREMENTS)
    assert none == {"remove": False, "line": "%s was not made" % VENV}
    # A directory that is not a venv is never removed.
    other = {"exists": True, "pyvenv_cfg": False, "entries": ["data"]}
    assert not prepare_hosts_after_failure(probe(venv_dir=other), VENV, REQUIREMENTS)["remove"]
    unread = prepare_hosts_after_failure(probe(rc=1), VENV, REQUIREMENTS)
    assert not unread["remove"] and unread["line"].startswith("%s could not be looked at after the failure" % VENV)
