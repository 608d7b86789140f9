"""Issue 22 items 1, 4, 5 and 6 (role and playbooks): a selection variable that is set but selects nothing is
refused before anything is signalled, through every channel an operator uses (a vars file whose entries are all
commented out, -e JSON, a template that rendered null or nothing); gates that would pass without checking fail and
say so; typed values are refused under the variable's name, as given."""

from __future__ import annotations

import json
import re

import pytest

from ansible_run import playbook
from nodetools import alive, start_holder
from simnode import inventory_file
from test_role_inputs import CHECK, RESET

SELECTIONS = ("gpus", "match", "pids", "users", "units", "containers", "pods", "slurm_jobs")


def _refused(node, holders, inventory, variable, words, *args):
    rc, out, recap = playbook(inventory, RESET, *args)
    assert rc != 0, (variable, args, out)
    assert "nothing was signalled: %s %s" % (variable, words) in out, (variable, args, out)
    assert "would signal 0" not in out and "would signal PID" not in out and "  PID " not in out, (variable, args, out)
    assert all(alive(node, pid) for pid in holders), (variable, args)


def _each_alias_refused(node, holders, tmp_path, cases):
    """One reset_gpus run over an inventory with one alias of `node` per case, each with its own host_vars file (a
    vars file as an operator writes it): every alias is refused with its own words and nothing is signalled.
    `cases`: [(vars file text, variable, words)]."""
    directory = tmp_path / "aliases"
    (directory / "host_vars").mkdir(parents=True)
    connection = inventory_file(tmp_path, node).read_text().splitlines()[1].split(" ", 1)[1]
    aliases = ["case%02d" % number for number in range(len(cases))]
    (directory / "hosts.ini").write_text(
        "\n".join(["[gpunodes]"] + ["%s %s" % (a, connection) for a in aliases]) + "\n"
    )
    for alias, (text, _variable, _words) in zip(aliases, cases):
        (directory / "host_vars" / ("%s.yml" % alias)).write_text(text)
    rc, out, recap = playbook(directory / "hosts.ini", RESET)
    assert rc != 0, out
    for alias, (text, variable, words) in zip(aliases, cases):
        failed = [line for line in out.splitlines() if "[%s]" % alias in line and "FAILED" in line]
        assert any("nothing was signalled: %s %s" % (variable, words) in line for line in failed), (alias, text, out)
    assert "would signal" not in out and "  PID " not in out, out
    assert all(alive(node, pid) for pid in holders)


@pytest.mark.slow
def test_null_selection_through_each_channel_is_refused_and_nothing_is_signalled(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.1)
    holders = [start_holder(node, [0], mib=3000), start_holder(node, [1], mib=3000)]
    inventory = inventory_file(tmp_path, node)
    # Vars files, one alias of the node each (one run for all): every selection variable whose list entries are all
    # commented out (the value is null); templates that rendered null, nothing, blank, an empty list, a list with a
    # null entry; blank text and lists with a null or blank entry.
    cases = [("reset_gpus_%s:\n#  - 0\n#  - 1\n" % kind, "reset_gpus_" + kind, "is null") for kind in SELECTIONS]
    for value, words in (
        ("{{ no_such_list | default(none) }}", "is null"),
        ("{{ '' }}", "is empty"),
        ("{{ '   ' }}", "is blank"),
        ("{{ [] }}", "is empty"),
        ("{{ [none] }}", "has a null or blank entry"),
        ("{{ [' '] }}", "has a null or blank entry"),
    ):
        for kind in ("gpus", "pids", "units"):
            cases.append((json.dumps({"reset_gpus_" + kind: value}), "reset_gpus_" + kind, words))
    cases += [
        ('reset_gpus_match: "  "\n', "reset_gpus_match", "is blank"),
        ("reset_gpus_gpus: [null]\n", "reset_gpus_gpus", "has a null or blank entry"),
        ("reset_gpus_users: [null, root]\n", "reset_gpus_users", "has a null or blank entry"),
        ('reset_gpus_gpus: " , "\n', "reset_gpus_gpus", "is empty"),
    ]
    _each_alias_refused(node, holders, tmp_path, cases)
    # -e: JSON null in a real run and in check mode, a vars file, typed values under the variable's name, as given.
    _refused(node, holders, inventory, "reset_gpus_gpus", "is null", "-e", json.dumps({"reset_gpus_gpus": None}))
    _refused(
        node, holders, inventory, "reset_gpus_slurm_jobs", "is null", "-e", '{"reset_gpus_slurm_jobs": null}', "--check"
    )
    commented = tmp_path / "commented.yml"
    commented.write_text("reset_gpus_units:\n#  - vllm.service\n")
    _refused(node, holders, inventory, "reset_gpus_units", "is null", "-e", "@%s" % commented)
    _refused(node, holders, inventory, "reset_gpus_pids", "must list PIDs", "-e", "reset_gpus_pids=abc")
    rc, out, recap = playbook(inventory, RESET, "-e", "reset_gpus_timeout=-1")
    assert rc != 0 and "nothing was signalled: invalid value: reset_gpus_timeout=-1 (must not be negative)" in out, out
    assert all(alive(node, pid) for pid in holders)
    # A selection that selects something still works: GPU 1 only, then unset (any) ends the rest.
    rc, out, recap = playbook(inventory, RESET, "-e", "reset_gpus_gpus=1")
    assert rc == 0 and alive(node, holders[0]) and not alive(node, holders[1]), out
    rc, out, recap = playbook(inventory, RESET)
    assert rc == 0 and not alive(node, holders[0]), out


def test_check_gpus_refuses_a_null_selection_and_bad_values_by_name(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.1)
    holder = start_holder(node, [1], mib=3000)
    inventory = inventory_file(tmp_path, node)
    commented = tmp_path / "commented.yml"
    commented.write_text("check_gpus_gpus:\n#  - 1\n")
    templated = tmp_path / "templated.yml"
    templated.write_text(json.dumps({"check_gpus_gpus": "{{ no_such_list | default([]) }}"}))
    for args, words in (
        (("-e", "@%s" % commented), "check_gpus_gpus is null"),
        (("-e", '{"check_gpus_gpus": null}'), "check_gpus_gpus is null"),
        (("-e", "@%s" % templated), "check_gpus_gpus is empty"),
        (("-e", "check_gpus_wait=-1"), "invalid value: check_gpus_wait=-1 (must not be negative)"),
        (("-e", "check_gpus_max_used_mib=lots"), "check_gpus_max_used_mib must be a whole number, not 'lots'"),
        (("-e", "check_gpus_driver_timeout=0"), "invalid value: check_gpus_driver_timeout=0 (must be greater than 0)"),
        (("-e", "check_gpus_allow_proc_only=maybe"), "check_gpus_allow_proc_only must be true or false"),
        (("-e", '{"check_gpus_gpu": [0]}'), "unknown variable(s) check_gpus_gpu (a typo?)"),
        (("-e", "check_gpus_hosts=no_such_group"), "check_gpus_hosts=no_such_group matches no host"),
    ):
        rc, out, recap = playbook(inventory, CHECK, *args)
        assert rc != 0 and "check_gpus: nothing was checked: " + words in out, (args, out)
        # Never the module's option names (timeout=-1.0, max_used_mib): the variable, as given.
        assert not re.search(r"(?<![a-z_])(timeout|max_used_mib)=", out) and "GPUs free" not in out, (args, out)
    assert alive(node, holder)
    # The selection as given still checks: GPU 0 is free, GPU 1 is held.
    rc, out, recap = playbook(inventory, CHECK, "-e", "check_gpus_gpus=0", "-e", "check_gpus_wait=0")
    assert rc == 0 and "check_gpus %s: GPUs free (1 checked)" % node.name in out, out
    rc, out, recap = playbook(inventory, CHECK, "-e", "check_gpus_wait=0")
    assert rc != 0 and "check_gpus %s: not free: GPU 1: 3000 MiB used" % node.name in out, out


def test_check_gpus_that_would_check_nothing_fails(tmp_path):
    # An inventory that does not parse: Ansible warns, finds no host and would exit 0 with no summary.
    broken = tmp_path / "broken.ini"
    broken.write_text("[gpunodes\nnode01 ansible_host=\n")
    rc, out, recap = playbook(broken, CHECK)
    assert rc != 0 and "check_gpus: nothing was checked: the inventory lists no host (did it parse?" in out, out
    empty = tmp_path / "empty.ini"
    empty.write_text("[gpunodes]\n")
    rc, out, recap = playbook(empty, CHECK)
    assert rc != 0 and "the inventory lists no host" in out, out


def test_reset_gpus_that_would_reset_nothing_fails(simnode, tmp_path):
    # Ansible itself warns "Could not match supplied host pattern" and exits 0: a pipeline would go on as if reset.
    node = simnode(gpus=1, release_latency=0.1)
    holder = start_holder(node, [0], mib=3000)
    inventory = inventory_file(tmp_path, node)
    rc, out, recap = playbook(inventory, RESET, "-e", "reset_gpus_hosts=no_such_group")
    message = "reset_gpus: nothing was signalled: reset_gpus_hosts=no_such_group matches no host of the inventory"
    assert rc != 0 and message in out and node.name not in recap, out
    assert alive(node, holder)
    broken = tmp_path / "broken.ini"
    broken.write_text("[gpunodes\nnode01 ansible_host=\n")
    rc, out, recap = playbook(broken, RESET)
    assert rc != 0 and "reset_gpus: nothing was signalled: the inventory lists no host (did it parse?" in out, out
    # localhost matches Ansible's implicit localhost, the controller itself, which the inventory does not list: the
    # reset would end holders of this machine (in --check, a newcomer saw other simulated nodes' TP workers listed).
    for pattern in ("localhost", "%s,127.0.0.1" % node.name):
        rc, out, recap = playbook(inventory, RESET, "--check", "-e", "reset_gpus_hosts=" + pattern)
        message = "reset_gpus: nothing was signalled: reset_gpus_hosts=%s matches " % pattern
        assert rc != 0 and message in out and "which the inventory does not list" in out, out
        assert "would signal" not in out and node.name not in recap, out
    # The pattern that names the node still resets it.
    rc, out, recap = playbook(inventory, RESET, "-e", "reset_gpus_hosts=%s" % node.name)
    assert rc == 0 and recap[node.name]["changed"] == 1 and not alive(node, holder), out


def test_check_gpus_names_what_check_gpus_exclude_leaves_out(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.1)
    holder = start_holder(node, [0], mib=69325, title="vllm-serve")
    inventory = inventory_file(tmp_path, node)
    rc, out, recap = playbook(inventory, CHECK, "-e", '{"check_gpus_exclude": ["vllm-serve"], "check_gpus_wait": 0}')
    line = next(line for line in out.splitlines() if "check_gpus %s:" % node.name in line)
    assert "but for what was left out: GPU 0: 69325 MiB held by PID %d vllm-serve" % holder in line, line
    assert "the rest of each GPU's used memory at most 256 MiB" in line, line
    assert "used memory at most 256 MiB each" not in out, out
    assert "1 free but for what was left out (%s)" % node.name in out, out
    assert alive(node, holder)
