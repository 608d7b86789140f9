# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The operator's variables of the playbooks and the reset_gpus role, checked on the controller before anything runs.

Each filter takes the variables as given (a dict of name -> value, only the names that are defined) and says what is
wrong in the operator's words: the variable's name and the value as given. Nothing here reads the GPUs.

- refuse_unknown_vars: variables with a playbook's prefix that it does not know (a typo) are refused by name.
- reset_gpus_plan: the reset_gpus role's variables as gpu_kill's and gpu_wait's options, or the refusal.
- check_gpus_plan: check_gpus.yml's variables as gpu_wait's options, or the refusal.
- plan_options: a plan's module options, or an undefined value that carries the refusal (the task then fails with it).

A selection variable that is unset (not defined) means "any". One that is set but selects nothing (null, as a vars
file whose entries are all commented out gives; blank text; a template that rendered null or nothing; an empty list;
a list with a null or blank entry) is refused: it must not widen a reset to every GPU.
"""

from __future__ import annotations

import functools
import os
from typing import Any, Callable, Collection, Dict, Iterable, List, Mapping, Optional, Tuple, Union

from ansible.errors import AnsibleFilterError
from jinja2 import pass_environment
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _options
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu._nothing import blank, names_nothing
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._numbers import Refused, numbers, shown
from ansible_collections.gpuops.nvidia.plugins.plugin_utils._tags import renamed

# PyYAML ships no type information (types-PyYAML is not installed).
import yaml  # type: ignore[import-untyped]

try:
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - PyYAML without libyaml
    from yaml import SafeLoader as _Loader

# The selection variables of the reset_gpus role (the part after the prefix = the module option), with what "unset"
# selects and what an entry is, in the words of the messages.
SELECTIONS = {
    "gpus": ("every GPU", "GPU indices or UUIDs"),
    "match": ("any command line", "a regex"),
    "pids": ("any PID", "PIDs"),
    "users": ("any user", "user names or UIDs"),
    "units": ("any unit", "systemd units"),
    "containers": ("any container", "container ids"),
    "pods": ("any pod", "pods"),
    "slurm_jobs": ("any Slurm job", "Slurm job ids"),
}
# Results the role and the playbooks register under their prefix: known, never the operator's.
RESET_RESULTS = ("reset_gpus_kill", "reset_gpus_wait", "reset_gpus_after")
CHECK_GPUS_KNOWN = (
    "check_gpus_hosts",
    "check_gpus_gpus",
    "check_gpus_wait",
    "check_gpus_max_used_mib",
    "check_gpus_exclude",
    "check_gpus_driver_timeout",
    "check_gpus_allow_proc_only",
)
CHECK_GPUS_RESULTS = ("check_gpus_result",)


@functools.lru_cache(maxsize=8)
def _spec_options(path: str, mtime: float) -> Tuple[str, ...]:
    with open(path) as handle:
        spec = yaml.load(handle, Loader=_Loader)
    return tuple(sorted(spec["argument_specs"]["main"]["options"]))


def spec_options(path: str) -> Tuple[str, ...]:
    """The option names of the main entry point of a role's meta/argument_specs.yml (parsed once per change)."""
    return _spec_options(path, os.stat(path).st_mtime)


def unknown_vars_message(names: Iterable[str], known: Iterable[str], subject: str = "the playbook") -> str:
    """The refusal of the names in `names` not in `known` ("" when none): "unknown variable(s) x_gpuss (a typo?);
    the playbook knows x_a, x_b"."""
    unknown = sorted(set(names) - set(known))
    if not unknown:
        return ""
    return "unknown variable(s) %s (a typo?); %s knows %s" % (", ".join(unknown), subject, ", ".join(sorted(known)))


def refuse_unknown_vars(
    names: Iterable[str],
    known: Iterable[str] = (),
    spec: Optional[str] = None,
    subject: str = "the playbook",
    results: Iterable[str] = (),
    prefix: str = "",
) -> bool:
    """Filter: True, or AnsibleFilterError naming each of `names` (from query('ansible.builtin.varnames', '^prefix_'))
    that is neither in `known` nor an option of the argument spec at path `spec`. `results` are names the play
    registers (or loop variables): accepted, not listed as known. `prefix` starts the message ("nothing was
    stopped: ").

    Example, one line in a play's first task: that: query('ansible.builtin.varnames', '^check_vllm_')
    | gpuops.nvidia.refuse_unknown_vars(['check_vllm_hosts', 'check_vllm_window'])
    """
    known = set(known) | set(spec_options(spec) if spec else ())
    message = unknown_vars_message(set(names) - set(results), known, subject)
    if message:
        raise AnsibleFilterError(prefix + message)
    return True


def _text(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def no_hosts(
    hosts: Iterable[str], variable: str, pattern: object = None, inventory: Optional[Collection[str]] = None
) -> str:
    """Filter: why a playbook would act on no host or on one the inventory does not list; "" when neither.

    `hosts`: the inventory hosts its host pattern matches (query('ansible.builtin.inventory_hostnames', ...)).
    `variable`: the variable that sets the pattern (reset_gpus_hosts); `pattern`: its value, None when it is not set.
    `inventory`: the hosts the inventory lists (groups['all']). A matched host outside it is Ansible's implicit
    localhost, the controller itself (the patterns localhost, 127.0.0.1 and ::1 match it although no inventory lists
    it). Ansible only warns when no host matched and exits 0: a pipeline would go on as if the play had run."""
    hosts = list(hosts)
    implicit = [host for host in hosts if inventory is not None and host not in inventory]
    if implicit:
        return (
            "%s=%s matches %s, which the inventory does not list: Ansible's implicit localhost, the controller "
            "itself; list it in the inventory to act on this machine" % (variable, _text(pattern), ", ".join(implicit))
        )
    if hosts:
        return ""
    if pattern is not None:
        return "%s=%s matches no host of the inventory" % (variable, _text(pattern))
    return "the inventory lists no host (did it parse? see Ansible's warnings above)"


def _entries(value: object) -> List[Any]:
    """A list variable's entries, however it was given: a YAML list, one value (0, "GPU-..."), or text from
    `-e name=0,1` or `-e name=[0,1]` (split at commas, brackets, quotes and blanks around each entry dropped)."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        parts = (part.strip().strip("'\"").strip() for part in text.split(","))
        return [part for part in parts if part]
    return [value]


def selection(name: str, value: object, kind: str) -> Union[str, List[Any]]:
    """The module's value of selection variable `name` (given, so never "any"), or Refused: null, blank text, an
    empty list, a list with a null or blank entry, a PID that is not a whole number."""
    anything, what = SELECTIONS[kind]
    # What names nothing is _select.names_nothing's to say, for the modules and the action plugin too.
    nothing = names_nothing(value)
    if nothing == "null":
        why = (
            "%s is null: it is set to nothing (a vars file whose entries are all commented out, or a template that "
            "rendered null)" % name
        )
    elif nothing in ("empty", "blank") and isinstance(value, str):
        why = "%s is %s (%s)" % (name, nothing, shown(value))
    elif kind == "match":
        return _text(value)
    elif isinstance(value, dict) or isinstance(value, bool):
        why = "%s must list %s, not %s" % (name, what, shown(value))
    else:
        entries = _entries(value)
        nothing = names_nothing(entries)
        if nothing == "empty":
            why = "%s is empty (%s): an empty selection selects nothing" % (name, shown(value))
        elif nothing is not None:
            why = "%s has a null or blank entry (%s)" % (name, shown(value))
        elif kind == "pids":
            bad = [
                entry
                for entry in entries
                if isinstance(entry, bool) or not _text(entry).strip().isdigit() or int(_text(entry)) <= 0
            ]
            if bad:
                raise Refused(
                    "%s must list PIDs, positive whole numbers, not %s" % (name, ", ".join(repr(b) for b in bad))
                )
            return [int(_text(entry)) for entry in entries]
        else:
            return [entry if isinstance(entry, int) and kind == "gpus" else _text(entry).strip() for entry in entries]
    raise Refused("%s; list %s, or leave %s unset (omit it) to select %s" % (why, what, name, anything))


def _flag(name: str, value: object) -> bool:
    try:
        flag: bool = boolean(value, strict=True)
    except TypeError:
        raise Refused("%s must be true or false, not %s" % (name, shown(value)))
    return flag


def _names(name: str, value: object) -> List[str]:
    """A list of text (exclude): entries as given, without blank ones; Refused for a dict or a null entry."""
    if value is None:
        return []
    if isinstance(value, dict):
        raise Refused("%s must list process names, not %s" % (name, shown(value)))
    entries = _entries(value)
    if any(entry is None for entry in entries):
        raise Refused("%s has a null entry (%s)" % (name, shown(value)))
    return [_text(entry).strip() for entry in entries if _text(entry).strip()]


# Kernel file systems where root's write permission does not let a directory be made (os.access says yes there).
_KERNEL_FS = ("/proc", "/sys", "/dev")


def _writable_dir(path: str) -> Optional[str]:
    """Why files cannot be written in directory `path` (created when missing), or None."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        return "%s is not a directory" % probe
    if any(probe == top or probe.startswith(top + "/") for top in _KERNEL_FS):
        return "%s is a kernel file system" % probe
    if not os.access(probe, os.W_OK | os.X_OK):
        return "%s is not writable" % probe
    return None


def _textfile_refusal(path: str, found: Optional[Mapping[str, Any]]) -> Optional[str]:
    """Why the textfile `path` cannot be written on the host, from ansible.builtin.stat's result `found` for its
    directory (None or {} when not looked at), or None."""
    if not path.startswith("/") or not path.endswith(".prom"):
        # node_exporter's textfile collector reads the files *.prom of its directory (as gpu_guard's textfile).
        return "reset_gpus_textfile must be an absolute path on the host ending in .prom, not %s" % shown(path)
    found = (found or {}).get("stat")
    if found is None:
        return None
    directory = os.path.dirname(path)
    if not found.get("exists"):
        why = "%s does not exist" % directory
    elif not found.get("isdir"):
        why = "%s is not a directory" % directory
    elif not found.get("writeable") or not found.get("executable"):
        why = "%s is not writable" % directory
    else:
        return None
    return "reset_gpus_textfile %s cannot be written on the host: %s" % (path, why)


def reset_gpus_plan(
    given: Mapping[str, Any], spec: str, textfile_dir: Optional[Mapping[str, Any]] = None
) -> Dict[str, Any]:
    """Filter: the reset_gpus role's variables `given` ({name: value} of every defined reset_gpus_ variable) as
    {"refusal": None or the reason nothing was signalled, "kill": gpu_kill's options, "group": the options gpu_kill
    and gpu_wait share (the later slices of the wait)}. `spec`: the path of the role's meta/argument_specs.yml;
    `textfile_dir`: ansible.builtin.stat's result for the directory of reset_gpus_textfile on the host. "report":
    whether a report is asked for and its directory can hold it (a refused run's report is written too)."""
    report_dir = _text(given.get("reset_gpus_report_dir") or "")
    report_why = _writable_dir(report_dir) if report_dir.strip() else None
    report = bool(report_dir.strip()) and report_why is None
    try:
        textfile = _text(given.get("reset_gpus_textfile") or "").strip()
        why = _textfile_refusal(textfile, textfile_dir) if textfile else None
        if why:
            raise Refused(why)
        return dict(refusal=None, report=report, **_reset_gpus_options(given, spec, report_why))
    except Refused as exc:
        refusal = "nothing was signalled: %s" % exc
        return {"refusal": refusal, "report": report, "kill": {}, "group": {}, "gpu_reset": None}


def _reset_gpus_options(given: Mapping[str, Any], spec: str, report_why: Optional[str]) -> Dict[str, Dict[str, Any]]:
    """gpu_kill's options and the group's from the role's variables `given`; Refused for the first bad one
    (`report_why`: why reset_gpus_report_dir cannot hold the report, None where it can or is not asked for)."""
    message = unknown_vars_message(
        set(given) - set(RESET_RESULTS), set(spec_options(spec)) | {"reset_gpus_hosts"}, "the role"
    )
    if message:
        raise Refused(message)
    group: Dict[str, Any] = {
        kind: selection("reset_gpus_" + kind, given["reset_gpus_" + kind], kind)
        for kind in SELECTIONS
        if "reset_gpus_" + kind in given
    }
    if "reset_gpus_pid_start_ticks" in given:
        ticks = given["reset_gpus_pid_start_ticks"]
        if not isinstance(ticks, dict) or not ticks:
            raise Refused(
                "reset_gpus_pid_start_ticks must map PIDs of reset_gpus_pids to start times, not %s" % shown(ticks)
            )
        group["pid_start_ticks"] = dict(ticks)
    values = _reset_gpus_numbers(given)
    if report_why:
        report_dir = _text(given["reset_gpus_report_dir"])
        raise Refused("reset_gpus_report_dir %s cannot hold the report: %s" % (report_dir, report_why))
    group.update(
        exclude=_names("reset_gpus_exclude", given.get("reset_gpus_exclude")),
        include_protected=_flag("reset_gpus_include_protected", given.get("reset_gpus_include_protected", False)),
        max_used_mib=values["reset_gpus_max_used_mib"],
        driver_timeout=values["reset_gpus_driver_timeout"],
    )
    signal = given.get("reset_gpus_signal", "SIGTERM")
    if blank(signal):
        raise Refused("reset_gpus_signal must name a signal (SIGTERM, SIGINT, ...), not %s" % shown(signal))
    kill = dict(
        group,
        signal=_text(signal).strip(),
        grace_period=values["reset_gpus_grace_period"],
        kill_wait=values["reset_gpus_kill_wait"],
        stop_owners=_flag("reset_gpus_stop_owners", given.get("reset_gpus_stop_owners", False)),
        wait_timeout=min(values["reset_gpus_progress_interval"], values["reset_gpus_timeout"]),
    )
    # false is gpu_kill's default: passed only when asked for.
    if _flag("reset_gpus_stop_spanning_owners", given.get("reset_gpus_stop_spanning_owners", False)):
        kill["stop_spanning_owners"] = True
    return {"kill": kill, "group": group, "gpu_reset": _gpu_reset_options(given, group, values)}


# The variables that choose processes, not GPUs: with them, the GPU reset needs reset_gpus_gpus.
_NARROWING = (
    "reset_gpus_pids",
    "reset_gpus_match",
    "reset_gpus_users",
    "reset_gpus_units",
    "reset_gpus_containers",
    "reset_gpus_pods",
    "reset_gpus_slurm_jobs",
)


def _gpu_reset_options(given: Mapping[str, Any], group: Mapping[str, Any], values: Mapping[str, Any]) -> Any:
    """gpu_reset's options where reset_gpus_gpu_reset asks for the guarded GPU reset (docs/recovery.md), else None."""
    if not _flag("reset_gpus_gpu_reset", given.get("reset_gpus_gpu_reset", False)):
        return None
    narrowing = sorted(name for name in _NARROWING if name in given)
    if narrowing and "gpus" not in group:
        # A reset chosen by process would reset every GPU of the host that needs it, not only theirs.
        raise Refused(
            "reset_gpus_gpu_reset with %s resets GPUs, not processes: name them in reset_gpus_gpus"
            % ", ".join(narrowing)
        )
    options = {
        "max_used_mib": group["max_used_mib"],
        "driver_timeout": group["driver_timeout"],
        "reset_timeout": values["reset_gpus_gpu_reset_timeout"],
        "own_pid_namespace": _flag(
            "reset_gpus_gpu_reset_own_pid_namespace", given.get("reset_gpus_gpu_reset_own_pid_namespace", False)
        ),
    }
    if "gpus" in group:
        options["gpus"] = group["gpus"]
    return options


# The number variables whose defaults and bounds are those of the options they set (_options.ROLE_NUMBERS).
_RESET_NUMBERS = (
    "reset_gpus_grace_period",
    "reset_gpus_kill_wait",
    "reset_gpus_timeout",
    "reset_gpus_max_used_mib",
    "reset_gpus_driver_timeout",
    "reset_gpus_progress_interval",
    "reset_gpus_gpu_reset_timeout",
)
_CHECK_NUMBERS = ("check_gpus_wait", "check_gpus_max_used_mib", "check_gpus_driver_timeout")


def _reset_gpus_numbers(given: Mapping[str, Any]) -> Dict[str, Any]:
    """The role's number variables, checked (_numbers.numbers), with the bounds of the gpu_kill and gpu_wait options
    they set (the progress interval is a slice of the wait)."""
    return numbers(
        given,
        positive=("reset_gpus_driver_timeout", "reset_gpus_progress_interval", "reset_gpus_gpu_reset_timeout"),
        whole=("reset_gpus_max_used_mib",),
        at_most=_options.role_bounds(*_RESET_NUMBERS),
        **_options.role_defaults(*_RESET_NUMBERS),
    )


def check_gpus_plan(
    given: Mapping[str, Any], hosts: Optional[Iterable[str]] = None, inventory: Optional[Collection[str]] = None
) -> Dict[str, Any]:
    """Filter: check_gpus.yml's variables `given` ({name: value} of every defined check_gpus_ variable) as
    {"refusal": None or why nothing was checked, "options": gpu_wait's options}. With `hosts` (the inventory hosts
    that check_gpus_hosts matches) and `inventory` (groups['all']), the pattern is checked too (no_hosts)."""
    try:
        return {"refusal": None, "options": _check_gpus_options(given, hosts, inventory)}
    except Refused as exc:
        return {"refusal": "nothing was checked: %s" % exc, "options": {}}


def _check_gpus_options(
    given: Mapping[str, Any], hosts: Optional[Iterable[str]], inventory: Optional[Collection[str]]
) -> Dict[str, Any]:
    message = unknown_vars_message(set(given) - set(CHECK_GPUS_RESULTS), CHECK_GPUS_KNOWN)
    if message:
        raise Refused(message)
    refusal = "" if hosts is None else no_hosts(hosts, "check_gpus_hosts", given.get("check_gpus_hosts"), inventory)
    if refusal:
        raise Refused(refusal)
    values = numbers(
        given,
        positive=("check_gpus_driver_timeout",),
        whole=("check_gpus_max_used_mib",),
        at_most=_options.role_bounds(*_CHECK_NUMBERS),
        **_options.role_defaults(*_CHECK_NUMBERS),
    )
    options: Dict[str, Any] = dict(
        timeout=values["check_gpus_wait"],
        max_used_mib=values["check_gpus_max_used_mib"],
        driver_timeout=values["check_gpus_driver_timeout"],
        exclude=_names("check_gpus_exclude", given.get("check_gpus_exclude")),
        require_memory=not _flag("check_gpus_allow_proc_only", given.get("check_gpus_allow_proc_only", False)),
        # What the driver advises (a reset, a reboot) fails the host too (docs/recovery.md).
        recovery=True,
        return_after=False,
    )
    if "check_gpus_gpus" in given:
        options["gpus"] = selection("check_gpus_gpus", given["check_gpus_gpus"], "gpus")
    return options


@pass_environment
def plan_options(environment: Any, plan: Mapping[str, Any], key: str, prefix: str = "") -> Any:
    """Filter: `plan[key]`, the module options of a plan (reset_gpus_plan, check_gpus_plan), where the plan has no
    refusal; else an undefined value whose hint is `prefix` and the refusal. As a task's module defaults it makes the
    task fail with that reason before the module runs (nothing is signalled), on every ansible-core the collection
    supports. Jinja's own undefined, so the plan is templated once."""
    refusal = plan.get("refusal")
    if refusal:
        return environment.undefined(hint="%s%s" % (prefix, refusal))
    return plan[key]


class FilterModule(object):
    """The checks of the operator's variables."""

    def filters(self) -> Dict[str, Callable[..., Any]]:
        return {
            "refuse_unknown_vars": refuse_unknown_vars,
            "reset_gpus_plan": reset_gpus_plan,
            "check_gpus_plan": check_gpus_plan,
            "no_hosts": no_hosts,
            "plan_options": plan_options,
            "renamed_tags": renamed,
        }
