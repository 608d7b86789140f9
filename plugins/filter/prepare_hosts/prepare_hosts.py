# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the prepare_hosts role does on a host, decided on the controller from what the host has. Found as
gpuops.nvidia.prepare_hosts.plan and gpuops.nvidia.prepare_hosts.wheels: in a subdirectory of plugins/filter/ so that a
lookup of the collection's other filters does not import these, nor packaging (docs/architecture.md, "Filters").

prepare_hosts_plan(probe, venv, requirements, wheels, wheels_dir, check_mode, verify): `probe` is the registered result
of roles/prepare_hosts/files/probe.py; returns {"install", "remake" (remove a venv whose Python does not run first),
"packages", "package_manager", "python", "ready", "line", "error"}.
prepare_hosts_wheels(directory, requirements): the wheel files of a controller directory, refused with a clear error
when a required project has none.
prepare_hosts_after_failure(probe, venv, requirements): {"remove", "line"}: whether a failed install left a venv that
lacks a library (removed, so that the modules fall back to the task's interpreter), and what the failure says of it.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Iterable, List, Literal, Mapping, Optional, Sequence, Tuple, TypedDict

from ansible.errors import AnsibleFilterError

try:
    # A dependency of ansible-core (its own version checks use it), so present on every controller.
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
except ImportError as error:  # pragma: no cover - only where ansible-core was installed without its dependencies
    PACKAGING_ERROR: Optional[ImportError] = error
    # Only for the except clauses below: mypy sees packaging's classes, this fallback replaces them.
    InvalidRequirement = InvalidWheelFilename = ValueError  # type: ignore[misc,assignment]
else:
    PACKAGING_ERROR = None

# A package manager the role installs distribution packages with.
PackageManager = Literal["apt", "dnf"]
# What the host's Python may lack before the venv can be made (_packages).
Need = Literal["ensurepip", "packaging"]
# The oldest Python the modules run on (tests/config.yml).
MIN_PYTHON = (3, 9)
# Distribution packages, by package manager: ensurepip for `python3 -m venv` (Debian and Ubuntu ship it apart, in
# python3-venv; Fedora and RHEL's python3 needs the bundled pip wheel), and a requirement parser for Ansible's pip
# module (packaging, or setuptools' pkg_resources).
OS_PACKAGES: Dict[PackageManager, Dict[Need, List[str]]] = {
    "apt": {"ensurepip": ["python3-venv"], "packaging": ["python3-packaging"]},
    "dnf": {"ensurepip": ["python3-pip-wheel"], "packaging": ["python3-packaging"]},
}
FAMILIES: Dict[PackageManager, Tuple[str, ...]] = {"apt": ("debian", "ubuntu"), "dnf": ("rhel", "fedora", "centos")}
# probe.py's JSON (its look at an interpreter, the venv, the OS), or the registered result of running it.
Probe = Mapping[str, Any]


class HostPlan(TypedDict):
    """What prepare_hosts_plan gives (the module docstring)."""

    install: bool
    remake: bool
    packages: List[str]
    package_manager: Optional[PackageManager]
    python: Optional[str]
    ready: bool
    line: str
    error: Optional[str]


class AfterFailure(TypedDict):
    """What prepare_hosts_after_failure gives: whether to remove the venv, and the line that says why."""

    remove: bool
    line: str


def _requirements(requirements: Iterable[str]) -> List[Requirement]:
    if PACKAGING_ERROR is not None:
        raise AnsibleFilterError(
            "prepare_hosts needs the Python library packaging on the controller: %s" % PACKAGING_ERROR
        )
    try:
        return [Requirement(text) for text in requirements]
    except InvalidRequirement as error:
        raise AnsibleFilterError("prepare_hosts_requirements: %s" % error)


def _lacking(found: Probe, requirements: Iterable[Requirement]) -> List[str]:
    """Requirement texts that interpreter `found` (probe.py's view of it) does not meet."""
    if not found.get("exists") or "version" not in found:
        return [str(requirement) for requirement in requirements]
    lacking = []
    for requirement in requirements:
        version = found.get(canonicalize_name(requirement.name)) or found.get(requirement.name)
        if not version or version == "unknown" or not requirement.specifier.contains(version, prereleases=True):
            lacking.append(str(requirement))
    return lacking


def _has(found: Probe, requirements: Iterable[Requirement]) -> str:
    return ", ".join(
        "%s %s" % (requirement.name, found.get(canonicalize_name(requirement.name))) for requirement in requirements
    )


def _package_manager(os_release: Probe) -> Optional[PackageManager]:
    names = [os_release.get("id", "")] + list(os_release.get("id_like") or [])
    for manager, families in FAMILIES.items():
        if any(name in families for name in names):
            return manager
    return None


def _read_probe(probe: Probe) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """probe.py's JSON, or an error line saying what could not be run."""
    command = " ".join(str(part) for part in (probe.get("cmd") or [])[:1]) or "python3"
    if probe.get("rc") != 0:
        said = (probe.get("stderr") or probe.get("msg") or "").strip().splitlines()
        return None, (
            "could not run %s on the host (%s): install the distribution's python3 (%d.%d or newer) or set "
            "prepare_hosts_python to one" % (command, said[-1] if said else "rc %s" % probe.get("rc"), *MIN_PYTHON)
        )
    try:
        return json.loads(probe["stdout"].strip().splitlines()[-1]), None
    except (KeyError, IndexError, ValueError):
        return None, "%s on the host printed no probe result: %r" % (command, (probe.get("stdout") or "")[-200:])


def _packages(found: Probe, fallback: Probe) -> Tuple[Optional[PackageManager], List[str], Optional[str]]:
    """(package manager, [packages], error) that the host needs before the venv can be made."""
    missing_by_need: Tuple[Tuple[Need, bool], ...] = (
        ("ensurepip", not found["python"]["ensurepip"]),
        ("packaging", not fallback.get("packaging")),
    )
    needs = [need for need, missing in missing_by_need if missing]
    if not needs:
        return None, [], None
    manager = _package_manager(found.get("os") or {})
    if manager is None:
        return (
            None,
            [],
            (
                "%s lacks %s and /etc/os-release names no Debian or Red Hat family: install the distribution's "
                "package for it, then run prepare_hosts again" % (found["python"]["executable"], " and ".join(needs))
            ),
        )
    return manager, [package for need in needs for package in OS_PACKAGES[manager][need]], None


def _install_line(
    venv: str,
    python: str,
    manager: Optional[PackageManager],
    packages: List[str],
    lacking_text: str,
    source: str,
    check_mode: bool,
) -> str:
    would = "would " if check_mode else ""
    steps = ["%sinstall %s (%s)" % (would, ", ".join(packages), manager)] if packages else []
    steps += ["%smake %s with %s -m venv" % (would, venv, python), "%sinstall %s %s" % (would, lacking_text, source)]
    return "prepare_hosts%s: %s" % (" (check mode)" if check_mode else "", "; ".join(steps))


def _verified(
    plan: HostPlan, venv: str, in_venv: Probe, lacking: List[str], requirements: List[Requirement]
) -> HostPlan:
    """`plan` after the install: ready when the venv lacks nothing, else an error that says what it still lacks."""
    plan["ready"] = not lacking
    plan["line"] = "prepare_hosts: %s ready: %s" % (venv, _has(in_venv, requirements))
    if lacking:
        plan["error"] = "after the install %s still lacks %s: %s" % (
            in_venv["path"],
            ", ".join(lacking),
            in_venv.get("error", _has(in_venv, requirements)),
        )
    return plan


def _nothing_to_do(
    venv: str, in_venv: Probe, lacking: List[str], fallback: Probe, requirements: List[Requirement]
) -> Optional[str]:
    """The line of a host whose venv (or, while there is none, whose Python) has every requirement; else None."""
    if in_venv.get("exists") and not lacking:
        return "prepare_hosts: nothing to do: %s has %s" % (venv, _has(in_venv, requirements))
    if not in_venv.get("exists") and not _lacking(fallback, requirements):
        return "prepare_hosts: nothing to do: %s has %s (the modules use it while %s does not exist)" % (
            fallback["path"],
            _has(fallback, requirements),
            venv,
        )
    return None


def _venv_dir(venv: str, directory: Probe, in_venv: Probe) -> Tuple[bool, Optional[str]]:
    """(remake, error) for the venv's directory: remake a venv whose Python no longer runs, refuse a non-venv."""
    if directory.get("exists") and "version" not in in_venv:  # its bin/python is missing or does not run
        if directory.get("pyvenv_cfg"):
            return True, None  # a venv whose Python no longer runs (its base Python was upgraded or removed)
        if set(directory.get("entries") or []) - {"wheels"}:
            return False, (
                "%s exists and is not a venv (no pyvenv.cfg; it holds %s): set gpuops_nvidia_venv to a new "
                "path" % (venv, ", ".join(directory["entries"]))
            )
    return False, None


def _install_reason(
    in_venv: Probe, lacking: List[str], fallback: Probe, requirements: List[Requirement], remake: bool
) -> str:
    """Why the venv is installed: what the venv (or the host's Python) lacks, or that the venv is made again."""
    if remake:
        return "%s does not run: the venv is made again" % in_venv["path"]
    if in_venv.get("exists"):
        return "%s lacks %s" % (in_venv["path"], ", ".join(lacking))
    return "%s lacks %s" % (fallback.get("path", "the host's Python"), ", ".join(_lacking(fallback, requirements)))


def prepare_hosts_plan(
    probe: Probe,
    venv: str,
    requirements: Sequence[str],
    wheels: Optional[Sequence[str]] = None,
    wheels_dir: str = "",
    check_mode: bool = False,
    verify: bool = False,
) -> HostPlan:
    """What the role does on this host; see the module docstring."""
    wanted = _requirements(requirements)
    plan: HostPlan = {
        "install": False,
        "remake": False,
        "packages": [],
        "package_manager": None,
        "python": None,
        "ready": False,
        "line": "",
        "error": None,
    }
    found, plan["error"] = _read_probe(probe)
    if found is None:
        return plan
    this, in_venv = found["python"], found["venv"]
    plan["python"] = this["executable"]
    lacking = _lacking(in_venv, wanted)
    if verify:
        return _verified(plan, venv, in_venv, lacking, wanted)
    fallback = (found.get("interpreters") or [{}])[0]
    ready_line = _nothing_to_do(venv, in_venv, lacking, fallback, wanted)
    if ready_line is not None:
        plan["ready"], plan["line"] = True, ready_line
        return plan
    plan["remake"], plan["error"] = _venv_dir(venv, found.get("venv_dir") or {}, in_venv)
    if plan["error"] is not None:
        return plan
    if tuple(int(part) for part in this["version"].split(".")[:2]) < MIN_PYTHON:
        plan["error"] = "%s is Python %s; the modules need %d.%d or newer: set prepare_hosts_python to a newer one" % (
            this["executable"],
            this["version"],
            *MIN_PYTHON,
        )
        return plan
    plan["package_manager"], plan["packages"], plan["error"] = _packages(found, fallback)
    source = "from the %d wheel(s) of %s" % (len(wheels or []), wheels_dir) if wheels_dir else "from the package index"
    requirements_text = ", ".join(str(requirement) for requirement in wanted)
    plan["install"] = plan["error"] is None
    plan["line"] = _install_line(
        venv, this["executable"], plan["package_manager"], plan["packages"], requirements_text, source, check_mode
    ) + " (%s)" % _install_reason(in_venv, lacking, fallback, wanted, plan["remake"])
    return plan


def prepare_hosts_after_failure(probe: Probe, venv: str, requirements: Sequence[str]) -> AfterFailure:
    """What to do with the venv after a failed install, from probe.py's look at it then: {"remove", "line"}.

    A venv that lacks a library (pip unreachable: made, then nothing or part installed) is removed. The modules try the
    venv's Python first and fall back to the task's interpreter only where it does not exist
    (plugins/plugin_utils/_interpreter.py): left in place, it would fail every module on the host. A venv with every
    library, one below its floor perhaps, is what the modules ran with before: it is kept. Only a venv (pyvenv.cfg) is
    ever removed."""
    wanted = _requirements(requirements)
    found, error = _read_probe(probe)
    if found is None:
        return {"remove": False, "line": "%s could not be looked at after the failure: %s" % (venv, error)}
    in_venv, directory = found["venv"], found.get("venv_dir") or {}
    if not directory.get("exists"):
        return {"remove": False, "line": "%s was not made" % venv}
    missing = [
        requirement.name
        for requirement in wanted
        if "version" not in in_venv or not in_venv.get(canonicalize_name(requirement.name))
    ]
    if not missing:
        return {"remove": False, "line": "%s is kept as it was: it has %s" % (venv, _has(in_venv, wanted))}
    if not directory.get("pyvenv_cfg"):
        return {"remove": False, "line": "%s is not a venv (no pyvenv.cfg): left as it is" % venv}
    return {
        "remove": True,
        "line": "%s was removed: the failed install left it without %s, and the modules would have tried it first. "
        "They use the task's interpreter until prepare_hosts succeeds" % (venv, ", ".join(missing)),
    }


def prepare_hosts_wheels(directory: object, requirements: Sequence[str]) -> List[str]:
    """Sorted paths of the *.whl files in controller directory `directory`; an error names a required project without one."""
    if not directory or not os.path.isdir(str(directory)):
        raise AnsibleFilterError("prepare_hosts_wheels_dir: %r is not a directory on the controller" % (directory,))
    wheels, projects = [], set()
    for name in sorted(os.listdir(str(directory))):
        if name.endswith(".whl"):
            try:
                projects.add(canonicalize_name(parse_wheel_filename(name)[0]))
            except InvalidWheelFilename:
                raise AnsibleFilterError("prepare_hosts_wheels_dir: %s is not a wheel file name" % name)
            wheels.append(os.path.join(os.path.abspath(str(directory)), name))
    missing = [
        requirement.name
        for requirement in _requirements(requirements)
        if canonicalize_name(requirement.name) not in projects
    ]
    if missing:
        raise AnsibleFilterError(
            "prepare_hosts_wheels_dir: %s has no wheel of %s (make them with: python3 -m pip download "
            "--only-binary=:all: --python-version X.Y -d %s %s)"
            % (directory, ", ".join(missing), directory, " ".join("'%s'" % text for text in requirements))
        )
    return wheels


class FilterModule:
    """Filters of the prepare_hosts role."""

    def filters(self) -> Dict[str, Callable[..., Any]]:
        return {
            "plan": prepare_hosts_plan,
            "wheels": prepare_hosts_wheels,
            "after_failure": prepare_hosts_after_failure,
        }
