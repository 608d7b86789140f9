"""playbooks/check_vllm.yml fails when it would check nothing (issue 22 item 4): a host pattern that matches no host,
a misspelt check_vllm_ variable, a host none of whose instances has a speculative config. No vLLM is needed: each
case fails before any instance is watched."""

from __future__ import annotations

import json

import pytest

from ansible_run import REPO, playbook

CHECK = REPO / "playbooks" / "check_vllm.yml"


@pytest.fixture
def local_inventory(tmp_path):
    path = tmp_path / "inventory.ini"
    path.write_text(
        "[gpu]\ngpu01 ansible_connection=local ansible_python_interpreter=%s\n"
        % REPO.joinpath(".venv", "bin", "python")
    )
    return path


@pytest.mark.parametrize(
    "args, words",
    [
        (
            ["-e", "check_vllm_hosts=no_such_group"],
            "check_vllm: nothing was checked: check_vllm_hosts=no_such_group matches no host",
        ),
        (["-e", "check_vllm_windw=5"], "unknown variable(s) check_vllm_windw (a typo?)"),
        (
            ["-e", json.dumps({"vllm_server_instances": [{"name": "plain", "model": "m", "port": 8000, "gpus": [0]}]})],
            "check_vllm gpu01: nothing was checked: none of the 1 instance(s) in vllm_server_instances has a speculative_config",
        ),
    ],
)
def test_a_check_that_would_check_nothing_fails_and_says_so(local_inventory, args, words):
    rc, out, _recap = playbook(local_inventory, CHECK, *args)
    assert rc != 0 and words in out, out


def test_an_inventory_that_lists_no_host_is_refused(tmp_path):
    # Ansible warns that the inventory did not parse, finds no host and would exit 0.
    broken = tmp_path / "broken.ini"
    broken.write_text("[gpu\ngpu01 ansible_host=\n")
    rc, out, _recap = playbook(broken, CHECK)
    assert rc != 0 and "check_vllm: nothing was checked: the inventory lists no host (did it parse?" in out, out
