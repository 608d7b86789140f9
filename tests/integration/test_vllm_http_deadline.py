"""Issue 33 item 9: a server on an instance's port that sends its answer a line at a time, each line before a
per-read socket timeout fires, used to hang `redeploy_vllm.yml --check` and `check_vllm.yml`. Every HTTP exchange now
has a total deadline, and its failure names the URL and what had not come. The server is test-local (tests/trickle.py),
on a free loopback port; the modules run inside a simulated node, which shares this machine's network."""

from __future__ import annotations

import json
import re

import pytest

from ansible_run import REPO, playbook
from ports import free_ports
from simnode import inventory_file
from test_vllm_server import instance, run, write_host_vars
from trickle import Trickle

CHECK = REPO / "playbooks" / "check_vllm.yml"


@pytest.fixture
def trickling():
    server = Trickle(port=free_ports(1)[0], stage="body", interval=0.5, lasting=90)
    yield server
    server.close()


def test_check_vllm_against_a_trickling_server_ends_at_its_bound(simnode, tmp_path, trickling):
    node = simnode(gpus=1)
    inventory = inventory_file(tmp_path, node)
    write_host_vars(tmp_path, node, [instance("q", trickling.port, [0])])
    rc, out, recap = playbook(inventory, CHECK, "-e", "check_vllm_window=2", "-e", "check_vllm_request_timeout=3")
    seconds = playbook.last_seconds
    print("check_vllm.yml against a trickling server: %.1f s" % seconds)
    assert rc != 0 and recap[node.name]["failed"] == 1, out
    url = "http://127.0.0.1:%d" % trickling.port
    assert re.search(
        r"check_vllm %s q: FAILED: %s: acceptance not measured: no complete answer from %s/metrics within 3 s: "
        r"the body was still coming \(\d+ bytes read\)" % (re.escape(node.name), re.escape(url), re.escape(url)),
        out,
    ), out
    # The first read of the counters ends at 3 s; the rest is Ansible's own start-up and polling.
    assert seconds < 2 + 3 + 20, seconds


def test_redeploy_check_mode_against_a_trickling_server_ends_and_names_it(simnode, tmp_path, trickling):
    node = simnode(gpus=2)
    inventory = inventory_file(tmp_path, node)
    write_host_vars(tmp_path, node, [instance("a", trickling.port, [0, 1])])
    rc, out, recap = run(inventory, "--check")
    seconds = playbook.last_seconds
    print("redeploy_vllm.yml --check against a trickling server: %.1f s" % seconds)
    assert rc != 0 and recap[node.name]["failed"] == 1 and recap[node.name]["changed"] == 0, out
    url = "http://127.0.0.1:%d" % trickling.port
    text = out.replace("\\n", "\n")
    assert re.search(
        r"instance a: port %d is already used on %s by a server that is not this instance \(GET /health: no complete "
        r"answer from %s/health within 5 s: the body was still coming \(\d+ bytes read\)\)"
        % (trickling.port, re.escape(node.name), re.escape(url)),
        text,
    ), out
    # vllm_server_host's look at the port ends at its request_timeout (5 s); the rest is Ansible's.
    assert seconds < 5 + 30, seconds
    assert json.dumps(trickling.connections) == "1"
