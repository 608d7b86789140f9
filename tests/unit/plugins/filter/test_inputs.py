# -*- coding: utf-8 -*-
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""plugins/filter/inputs.py: the operator's variables refused by name, as given; the options passed on."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpuops.nvidia.plugins.filter import inputs

SPEC = str(Path(__file__).resolve().parents[4] / "roles" / "reset_gpus" / "meta" / "argument_specs.yml")


@pytest.mark.parametrize(
    "value, words",
    [
        (None, "reset_gpus_gpus is null: it is set to nothing"),
        ("", "reset_gpus_gpus is empty ('')"),
        ("  ", "reset_gpus_gpus is blank ('  ')"),
        ([], "reset_gpus_gpus is empty ([])"),
        ("[]", "reset_gpus_gpus is empty ('[]')"),
        (" , ", "reset_gpus_gpus is empty (' , ')"),
        ([None], "reset_gpus_gpus has a null or blank entry ([null])"),
        ([0, None], "reset_gpus_gpus has a null or blank entry ([0, null])"),
        ([0, " "], "reset_gpus_gpus has a null or blank entry ([0, ' '])"),
        ({"a": None}, "reset_gpus_gpus must list GPU indices or UUIDs, not {'a': null}"),
        (True, "reset_gpus_gpus must list GPU indices or UUIDs, not true"),
    ],
)
def test_a_selection_that_selects_nothing_is_refused_by_name(value, words):
    plan = inputs.reset_gpus_plan({"reset_gpus_gpus": value}, SPEC)
    assert plan["refusal"].startswith("nothing was signalled: " + words), plan
    assert "leave reset_gpus_gpus unset (omit it) to select every GPU" in plan["refusal"] or "must list" in words
    assert plan["kill"] == {} and plan["group"] == {}


@pytest.mark.parametrize("kind", sorted(inputs.SELECTIONS))
def test_every_selection_variable_refuses_null_and_unset_is_left_out(kind):
    name = "reset_gpus_" + kind
    refusal = inputs.reset_gpus_plan({name: None}, SPEC)["refusal"]
    assert refusal.startswith("nothing was signalled: %s is null" % name), refusal
    assert "to select %s" % inputs.SELECTIONS[kind][0] in refusal
    plan = inputs.reset_gpus_plan({}, SPEC)
    assert plan["refusal"] is None and kind not in plan["kill"] and kind not in plan["group"]


@pytest.mark.parametrize(
    "value, expected",
    [(0, [0]), ("0,1", ["0", "1"]), ("[0, 1]", ["0", "1"]), ([1, "GPU-abc"], [1, "GPU-abc"]), ("GPU-abc", ["GPU-abc"])],
)
def test_gpus_as_given_are_passed_on(value, expected):
    plan = inputs.reset_gpus_plan({"reset_gpus_gpus": value}, SPEC)
    assert plan["refusal"] is None and plan["kill"]["gpus"] == expected == plan["group"]["gpus"]


def test_pids_users_and_owner_filters():
    plan = inputs.reset_gpus_plan(
        {
            "reset_gpus_pids": "12, 13",
            "reset_gpus_users": [0, "vllm"],
            "reset_gpus_units": "vllm@a",
            "reset_gpus_pods": "ml/vllm-0",
            "reset_gpus_match": 12,
        },
        SPEC,
    )
    assert plan["refusal"] is None, plan
    kill = plan["kill"]
    expected = ([12, 13], ["0", "vllm"], ["vllm@a"], ["ml/vllm-0"], "12")
    assert (kill["pids"], kill["users"], kill["units"], kill["pods"], kill["match"]) == expected
    for bad in ("abc", [0], [True], [-3]):
        refusal = inputs.reset_gpus_plan({"reset_gpus_pids": bad}, SPEC)["refusal"]
        assert refusal.startswith("nothing was signalled: reset_gpus_pids must list PIDs, positive whole numbers"), (
            refusal
        )


def test_defaults_and_numbers_as_given():
    kill = inputs.reset_gpus_plan({"reset_gpus_timeout": "30", "reset_gpus_progress_interval": 5}, SPEC)["kill"]
    assert kill["wait_timeout"] == 5 and kill["grace_period"] == 10 and kill["max_used_mib"] == 256
    assert kill["signal"] == "SIGTERM" and kill["stop_owners"] is False and "stop_spanning_owners" not in kill
    assert (
        inputs.reset_gpus_plan({"reset_gpus_stop_spanning_owners": "yes"}, SPEC)["kill"]["stop_spanning_owners"] is True
    )
    for given, words in (
        ({"reset_gpus_timeout": "-1"}, "invalid value: reset_gpus_timeout=-1 (must not be negative)"),
        ({"reset_gpus_progress_interval": 0}, "invalid value: reset_gpus_progress_interval=0 (must be greater than 0)"),
        ({"reset_gpus_grace_period": "nan"}, "invalid value: reset_gpus_grace_period=nan (must be a finite number)"),
        ({"reset_gpus_max_used_mib": "lots"}, "reset_gpus_max_used_mib must be a whole number, not 'lots'"),
        ({"reset_gpus_max_used_mib": 2.5}, "reset_gpus_max_used_mib must be a whole number, not 2.5"),
        ({"reset_gpus_stop_owners": "maybe"}, "reset_gpus_stop_owners must be true or false, not 'maybe'"),
        ({"reset_gpus_exclude": [None]}, "reset_gpus_exclude has a null entry ([null])"),
        ({"reset_gpus_signal": None}, "reset_gpus_signal must name a signal (SIGTERM, SIGINT, ...), not null"),
        ({"reset_gpus_timeout": None}, "reset_gpus_timeout must be a number, not null"),
        ({"reset_gpus_stop_owners": None}, "reset_gpus_stop_owners must be true or false, not null"),
    ):
        refusal = inputs.reset_gpus_plan(given, SPEC)["refusal"]
        assert refusal.startswith("nothing was signalled: " + words), refusal


@pytest.mark.parametrize(
    "name, bound",
    [
        ("reset_gpus_grace_period", 3600),
        ("reset_gpus_kill_wait", 600),
        ("reset_gpus_timeout", 3600),
        ("reset_gpus_driver_timeout", 600),
        ("reset_gpus_progress_interval", 3600),
    ],
)
def test_a_time_above_its_bound_is_refused_naming_the_variable_and_the_bound(name, bound):
    # Issue 33 item 11: reset_gpus_grace_period: 1e308 was accepted, and the reset then printed nothing for minutes.
    assert inputs.reset_gpus_plan({name: bound}, SPEC)["refusal"] is None
    for value, shown in ((1e308, "1e+308"), ("1e308", "1e+308"), (bound + 1, str(bound + 1))):
        refusal = inputs.reset_gpus_plan({name: value}, SPEC)["refusal"]
        assert refusal == "nothing was signalled: invalid value: %s=%s (must be at most %d seconds)" % (
            name,
            shown,
            bound,
        ), refusal


@pytest.mark.parametrize("name, bound", [("check_gpus_wait", 3600), ("check_gpus_driver_timeout", 600)])
def test_check_gpus_times_above_their_bound_are_refused_by_name(name, bound):
    assert inputs.check_gpus_plan({name: bound}, ["h"])["refusal"] is None
    refusal = inputs.check_gpus_plan({name: 1e308}, ["h"])["refusal"]
    assert refusal == "nothing was checked: invalid value: %s=1e+308 (must be at most %d seconds)" % (name, bound)


def test_unknown_variables_are_refused_with_what_the_role_knows():
    refusal = inputs.reset_gpus_plan({"reset_gpus_gpuss": [1], "reset_gpus_hosts": "all"}, SPEC)["refusal"]
    assert refusal.startswith(
        "nothing was signalled: unknown variable(s) reset_gpus_gpuss (a typo?); the role knows "
    ), refusal
    assert "reset_gpus_gpus, reset_gpus_grace_period" in refusal and "reset_gpus_hosts" in refusal
    with pytest.raises(
        AnsibleFilterError,
        match=r"^unknown variable\(s\) check_vllm_windw \(a typo\?\); the playbook knows "
        r"check_vllm_hosts, check_vllm_window$",
    ):
        inputs.refuse_unknown_vars(["check_vllm_windw", "check_vllm_hosts"], ["check_vllm_hosts", "check_vllm_window"])
    assert (
        inputs.refuse_unknown_vars(["reset_gpus_kill", "reset_gpus_gpus"], spec=SPEC, results=["reset_gpus_kill"])
        is True
    )


def test_destinations_are_checked_before_anything_is_signalled(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert inputs.reset_gpus_plan({"reset_gpus_report_dir": str(tmp_path / "new" / "deeper")}, SPEC)["refusal"] is None
    refusal = inputs.reset_gpus_plan({"reset_gpus_report_dir": str(blocker / "reports")}, SPEC)["refusal"]
    assert (
        refusal
        == "nothing was signalled: reset_gpus_report_dir %s cannot hold the report: %s is not a directory"
        % (blocker / "reports", blocker)
    )
    path = "/var/lib/node_exporter/gpu.prom"
    for found, words in (
        ({"stat": {"exists": False}}, "/var/lib/node_exporter does not exist"),
        ({"stat": {"exists": True, "isdir": False}}, "/var/lib/node_exporter is not a directory"),
        ({"stat": {"exists": True, "isdir": True, "writeable": False, "executable": True}}, "is not writable"),
    ):
        refusal = inputs.reset_gpus_plan({"reset_gpus_textfile": path}, SPEC, found)["refusal"]
        assert refusal.startswith(
            "nothing was signalled: reset_gpus_textfile %s cannot be written on the host: " % path
        ), refusal
        assert refusal.endswith(words), refusal
    ok = {"stat": {"exists": True, "isdir": True, "writeable": True, "executable": True}}
    assert inputs.reset_gpus_plan({"reset_gpus_textfile": path}, SPEC, ok)["refusal"] is None
    assert inputs.reset_gpus_plan({"reset_gpus_textfile": path}, SPEC, {"skipped": True})["refusal"] is None
    assert "must be an absolute path" in inputs.reset_gpus_plan({"reset_gpus_textfile": "x.prom"}, SPEC, ok)["refusal"]
    # A directory (or any name node_exporter's textfile collector does not read): refused before anything is signalled.
    refusal = inputs.reset_gpus_plan({"reset_gpus_textfile": "/var/lib/node_exporter"}, SPEC, ok)["refusal"]
    assert refusal == (
        "nothing was signalled: reset_gpus_textfile must be an absolute path on the host ending in .prom, not "
        "'/var/lib/node_exporter'"
    ), refusal
    # A report directory under /proc cannot be made, although root may write there as far as os.access tells.
    planned = inputs.reset_gpus_plan({"reset_gpus_report_dir": "/proc/nope"}, SPEC)
    assert planned["refusal"] == (
        "nothing was signalled: reset_gpus_report_dir /proc/nope cannot hold the report: /proc is a kernel file system"
    ), planned
    # The role writes no report there (the refusal said why once); a refused run's report goes where it can.
    assert planned["report"] is False and inputs.reset_gpus_plan({}, SPEC)["report"] is False
    refused_elsewhere = {"reset_gpus_report_dir": str(tmp_path / "reports"), "reset_gpus_signal": ""}
    planned = inputs.reset_gpus_plan(refused_elsewhere, SPEC)
    assert planned["refusal"] and planned["report"] is True, planned


def test_check_gpus_plan():
    plan = inputs.check_gpus_plan({}, ["gpu01"])
    assert plan == {
        "refusal": None,
        "options": {
            "timeout": 5,
            "max_used_mib": 256,
            "driver_timeout": 10,
            "exclude": [],
            "require_memory": True,
            "recovery": True,
            "return_after": False,
        },
    }
    plan = inputs.check_gpus_plan(
        {"check_gpus_gpus": "0,1", "check_gpus_allow_proc_only": "true", "check_gpus_exclude": "a, b"}
    )
    assert plan["options"]["gpus"] == ["0", "1"] and plan["options"]["require_memory"] is False
    assert plan["options"]["exclude"] == ["a", "b"]
    for given, hosts, words in (
        ({"check_gpus_gpus": None}, None, "check_gpus_gpus is null"),
        ({"check_gpus_wait": "-1"}, None, "invalid value: check_gpus_wait=-1 (must not be negative)"),
        ({"check_gpus_max_used_mib": "lots"}, None, "check_gpus_max_used_mib must be a whole number, not 'lots'"),
        ({"check_gpus_gpu": [0]}, None, "unknown variable(s) check_gpus_gpu (a typo?); the playbook knows"),
        ({"check_gpus_hosts": "nope"}, [], "check_gpus_hosts=nope matches no host of the inventory"),
        ({}, [], "the inventory lists no host (did it parse?"),
    ):
        refusal = inputs.check_gpus_plan(given, hosts)["refusal"]
        assert refusal.startswith("nothing was checked: " + words), refusal
    assert inputs.check_gpus_plan({"check_gpus_result": {}}, ["h"])["refusal"] is None


def test_no_hosts_says_why_a_playbook_would_act_on_no_host():
    assert inputs.no_hosts(["gpu01"], "reset_gpus_hosts", "gpu01") == ""
    assert inputs.no_hosts(["gpu01"], "reset_gpus_hosts") == ""
    assert (
        inputs.no_hosts([], "reset_gpus_hosts", "nosuch") == "reset_gpus_hosts=nosuch matches no host of the inventory"
    )
    assert inputs.no_hosts([], "check_vllm_hosts", 7) == "check_vllm_hosts=7 matches no host of the inventory"
    assert inputs.no_hosts([], "reset_gpus_hosts") == (
        "the inventory lists no host (did it parse? see Ansible's warnings above)"
    )


def test_no_hosts_refuses_the_implicit_localhost():
    # query('ansible.builtin.inventory_hostnames', 'localhost') answers ['localhost'] for an inventory without it.
    message = inputs.no_hosts(["gpu01", "localhost"], "reset_gpus_hosts", "gpu01,localhost", ["gpu01"])
    assert message == (
        "reset_gpus_hosts=gpu01,localhost matches localhost, which the inventory does not list: Ansible's implicit "
        "localhost, the controller itself; list it in the inventory to act on this machine"
    )
    assert inputs.no_hosts(["localhost"], "reset_gpus_hosts", "localhost", ["localhost", "gpu01"]) == ""
    refusal = inputs.check_gpus_plan({"check_gpus_hosts": "127.0.0.1"}, ["127.0.0.1"], ["gpu01"])["refusal"]
    assert refusal.startswith("nothing was checked: check_gpus_hosts=127.0.0.1 matches 127.0.0.1, which the inventory")


def test_plan_options_gives_the_options_or_an_undefined_that_carries_the_refusal():
    environment = jinja2.Environment(undefined=jinja2.StrictUndefined)
    plan = inputs.check_gpus_plan({"check_gpus_wait": 2})
    assert inputs.plan_options(environment, plan, "options") == plan["options"] != {}
    refused = inputs.check_gpus_plan({"check_gpus_wait": -1})
    value = inputs.plan_options(environment, refused, "options", "check_gpus: ")
    assert isinstance(value, jinja2.Undefined)
    with pytest.raises(jinja2.UndefinedError, match="^check_gpus: nothing was checked: .*check_gpus_wait=-1"):
        str(value)


@pytest.mark.parametrize(
    "run_tags, skip_tags, words",
    [
        (["all"], [], ""),
        (["reset_gpus_stop"], ["reset_gpus_report"], ""),
        (["stop"], [], "tag stop is reset_gpus_stop"),
        (["all"], ["report", "free"], "tag report is reset_gpus_report; tag free is reset_gpus_free"),
    ],
)
def test_a_bare_tag_of_before_is_refused_with_its_new_name(run_tags, skip_tags, words):
    refusal = inputs.FilterModule().filters()["renamed_tags"](
        run_tags, skip_tags, "reset_gpus", ["preflight", "stop", "free", "report"]
    )
    assert refusal.endswith(words) and bool(refusal) == bool(words), refusal
    if words:
        assert refusal.startswith(
            "the tags of reset_gpus are prefixed with its name now (reset_gpus_preflight, reset_gpus_stop, "
            "reset_gpus_free, reset_gpus_report): "
        )
