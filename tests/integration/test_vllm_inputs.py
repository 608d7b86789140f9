"""Issue 22 items 3 and 6, vllm_server side: a redeploy input that could be refused first is refused before anything
stops (the running server keeps its PIDs), with the reason naming what the operator set; --check lists the processes
a real run would end; the messages after a port change, a failed drain hook and a failed start are true."""

from __future__ import annotations

import json
import re

from ansible_run import REPO, playbook
from nodetools import processes
from simnode import inventory_file
from test_vllm_server import API_KEY, free_ports, instance, run, server_tree, summary, tree_pids, write_host_vars

CHECK = REPO / "playbooks" / "check_vllm.yml"


def flat(out):
    return out.replace("\\n", "\n").replace('\\"', '"')


def deployed(simnode, tmp_path, gpus=4, **node_knobs):
    """A node running instance a on GPUs 0 and 1, deployed by the role: (node, inventory, port, tree)."""
    node = simnode(gpus=gpus, release_latency=0.2, **node_knobs)
    port, spare = free_ports(2)
    inventory = inventory_file(tmp_path, node)
    write_host_vars(tmp_path, node, [instance("a", port, [0, 1])], spare_port=spare)
    rc, out, _recap = run(inventory)
    assert rc == 0, out
    return node, inventory, port, spare, server_tree(node, port)


def refused(inventory, node, port, tree, extra, *messages):
    """Run the redeploy with `extra`; it fails on the host, changes nothing, and the running server keeps its PIDs."""
    rc, out, recap = run(inventory, "-e", json.dumps(extra))
    text = flat(out)
    assert rc != 0 and recap[node.name]["failed"] == 1 and recap[node.name]["changed"] == 0, out
    for message in messages:
        assert re.search(message, text), (message, out)
    assert "nothing was stopped" in text, out
    assert server_tree(node, port) == tree, (extra, out)
    return text


def test_redeploy_inputs_are_refused_before_anything_stops(simnode, tmp_path):
    node, inventory, port, spare, tree = deployed(simnode, tmp_path)
    cases = [
        ({"port": 0}, r"instance a: port 0 is out of range: a TCP port is 1 to 65535"),
        ({"port": 70000}, r"instance a: port 70000 is out of range"),
        ({"port": -1}, r"instance a: port -1 is out of range"),
        ({"gpus": [0, 0, 1, 1]}, r"instance a: gpus 0, 0, 1, 1: GPU 0, 1 is listed more than once"),
        (
            {"gpus": "0,1,2,3"},
            r"instance a: gpus must be a list of GPU indices or UUIDs, not the text '0,1,2,3': "
            r"write gpus: \[0, 1, 2, 3\]",
        ),
        ({"max_model_len": -5}, r"instance a: max_model_len -5 must be a number of tokens of at least 1, or -1"),
        (
            {"extra_args": ["--port", str(spare)]},
            r"instance a: extra_args has --port, which the role sets itself: use port",
        ),
        (
            {"extra_args": ["--tensor-parallel-size", "2"]},
            r"extra_args has --tensor-parallel-size, which the role sets itself",
        ),
        (
            {"extra_args": ["--tensor-parallel-size=1", "--host=::"]},
            r"extra_args has --tensor-parallel-size, .*; extra_args has --host, which the role sets itself: use host",
        ),
        ({"extra_args": ["--served-model-name", "other"]}, r"extra_args has --served-model-name"),
    ]
    for override, message in cases:
        text = refused(inventory, node, port, tree, {"test_override": override}, message)
        assert "already used" not in text and "None" not in re.findall(r"nothing was stopped: [^\n]*", text)[0], text
    # The role's own numbers: Ansible's argument validation checks their type, not their range.
    refused(
        inventory,
        node,
        port,
        tree,
        {"vllm_server_gpu_max_used_mib": -5, "vllm_server_ready_poll_interval": 0},
        r"nothing was stopped: invalid value: vllm_server_gpu_max_used_mib=-5 \(must not be negative\); "
        r"vllm_server_ready_poll_interval=0 \(must be greater than 0\)",
    )


def test_secrets_in_extra_args_are_refused_and_never_shown(simnode, tmp_path):
    node, inventory, port, _spare, tree = deployed(simnode, tmp_path)
    for args in (["--api-key", API_KEY], ["--api-key=" + API_KEY], ["--hf-token", API_KEY]):
        rc, out, recap = run(inventory, "-vv", "-e", json.dumps({"test_override": {"extra_args": args}}))
        assert rc != 0 and recap[node.name]["changed"] == 0, out
        assert re.search(
            r"instance a: extra_args has --(api-key|hf-token) with a secret, .*\(its value is not shown\)", flat(out)
        ), out
        assert API_KEY not in out, out[max(0, out.find(API_KEY) - 1500) : out.find(API_KEY) + 100]
        assert server_tree(node, port) == tree
        assert all(API_KEY not in entry[3] for entry in processes(node).values())
    assert "set the instance's api_key: the role keeps it as VLLM_API_KEY" in flat(out) or "hf auth login" in flat(out)


def test_systemd_on_a_host_without_systemd_is_refused(simnode, tmp_path):
    node, inventory, port, _spare, tree = deployed(simnode, tmp_path)
    assert node.exec("test", "-d", "/run/systemd/system", check=False).returncode != 0  # the node runs no systemd
    refused(
        inventory,
        node,
        port,
        tree,
        {"vllm_server_service_manager": "systemd"},
        r"vllm_server_service_manager is systemd, but %s does not run systemd \(there is no directory /run/systemd/system"
        % re.escape(node.name),
    )


def test_a_lost_gpu_refuses_the_redeploy_before_the_stop(simnode, tmp_path):
    node, inventory, port, _spare, tree = deployed(simnode, tmp_path)
    node.set(lost=[1])
    refused(
        inventory,
        node,
        port,
        tree,
        {"test_override": {"gpu_memory_utilization": 0.85}},
        r"instance a: gpus: GPU 1 answers NVML with an error \([^)]*\), as gpu_facts reports it: the running server "
        r"would be stopped",
    )


def test_gpus_held_by_another_instance_of_the_role_are_refused(simnode, tmp_path):
    node, inventory, port, spare, tree = deployed(simnode, tmp_path)
    other = instance("c", spare, [1, 2])
    text = refused(
        inventory,
        node,
        port,
        tree,
        {"vllm_server_instances": [other]},
        r"instance c: GPU 1 is held by instance a \(deployed by this role on GPUs 0, 1, PIDs? [0-9, ]+\), "
        r"which the redeploy would end: it is not in vllm_server_instances",
    )
    pids = [int(pid) for pid in re.search(r"PIDs? ([0-9, ]+)\)", text).group(1).split(", ")]
    assert pids == [pid for pid in tree["workers"] if pid in pids] and len(pids) == 1, (
        pids,
        tree,
    )  # a's worker on GPU 1
    # Listed after c, a would still hold GPU 1 when c is deployed.
    moved = instance("a", port, [3])
    refused(
        inventory,
        node,
        port,
        tree,
        {"vllm_server_instances": [other, moved]},
        r"instance c: GPU 1 is held by instance a .*it is listed after c: list it first",
    )


def test_check_mode_lists_the_processes_a_run_would_end(simnode, tmp_path):
    node, inventory, port, _spare, tree = deployed(simnode, tmp_path)
    rc, out, recap = run(inventory, "--check", "-e", json.dumps({"test_override": {"gpu_memory_utilization": 0.85}}))
    assert rc == 0 and recap[node.name]["changed"] >= 1, out
    lines = summary(out, node)
    assert lines[0] == "a (GPUs 0,1, http://127.0.0.1:%d): would redeploy (configuration changed)" % port, lines
    assert lines[-3] == "  would end 2 process(es) on its GPUs, with their vLLM API server(s) %d:" % tree["api"], lines
    listed = sorted(int(line.split()[1]) for line in lines[-2:])
    assert listed == tree["workers"] and all("VLLM::Worker_TP" in line for line in lines[-2:]), lines
    assert server_tree(node, port) == tree
    # Moved to other GPUs: nothing holds them; the running server on GPUs 0 and 1 is named.
    rc, out, recap = run(inventory, "--check", "-e", json.dumps({"test_override": {"gpus": [2, 3]}}))
    assert rc == 0, out
    lines = summary(out, node)
    assert lines[-2:] == [
        "  would end no process on its GPUs (none holds them now)",
        "  would also stop the running server on GPUs 0,1 (its whole session)",
    ], lines
    assert server_tree(node, port) == tree


def test_a_port_change_reports_the_old_server_healthy_and_drained(simnode, tmp_path):
    node, inventory, port, spare, tree = deployed(simnode, tmp_path)
    rc, out, recap = run(
        inventory, "-e", json.dumps({"test_override": {"port": spare, "served_model_name": "renamed"}})
    )
    assert rc == 0, out
    lines = summary(out, node)
    assert lines[0] == "a (GPUs 0,1, http://127.0.0.1:%d): redeployed (configuration changed)" % spare, lines
    assert "not healthy" not in "\n".join(lines) and any(line.startswith("  drained in ") for line in lines), lines
    new = server_tree(node, spare)
    assert not set(tree_pids(new)) & set(tree_pids(tree))


def test_a_failed_drain_hook_says_what_failed(simnode, tmp_path):
    node, inventory, port, _spare, tree = deployed(simnode, tmp_path)
    hook = {
        "vllm_server_drain_command": "sh -c 'echo balancer refused: backend busy >&2; exit 3'",
        "test_override": {"gpu_memory_utilization": 0.85},
    }
    rc, out, recap = run(inventory, "-e", json.dumps(hook))
    assert rc != 0 and recap[node.name]["failed"] == 1, out
    lines = summary(out, node)
    assert lines[0] == "a (GPUs 0,1, http://127.0.0.1:%d): FAILED (configuration changed)" % port, lines
    text = "\n".join(lines)
    assert "vllm_server_drain_command" in text and "(rc 3), stderr: balancer refused: backend busy" in text, lines
    assert "nothing was stopped: the running server is as it was" in text and "checks failed before" not in out, lines
    assert re.search(
        r"vLLM instance a on %s: failed before anything was stopped, at .*vllm_server_drain_command.*rc 3"
        % re.escape(node.name),
        flat(out),
    ), out
    assert server_tree(node, port) == tree


def test_a_failed_start_shows_only_what_the_new_server_wrote(simnode, tmp_path):
    node, inventory, port, _spare, tree = deployed(simnode, tmp_path)
    log = tmp_path / node.name / "log" / "a.log"
    log.write_text(log.read_text() + "a line of an earlier run\n")
    crash = {"test_override": {"environment": {"SIMVLLM_LOAD_SECONDS": "0.3", "SIMVLLM_CRASH": "1"}}}
    rc, out, recap = run(inventory, "-e", json.dumps(crash))
    assert rc != 0 and "rolled back to the previous configuration" in out, out
    lines = summary(out, node)
    shown = lines[lines.index("  last lines the new server wrote to %s:" % log) + 1 :]
    assert shown and any("illegal memory access" in line for line in shown), lines
    assert not any("earlier run" in line for line in shown) and "earlier run" not in flat(out), out


def test_check_vllm_refuses_a_window_that_is_not_a_number(simnode, tmp_path):
    node = simnode(gpus=1)
    inventory = inventory_file(tmp_path, node)
    for value in ("abc", "-5", "0"):
        rc, out, _recap = playbook(inventory, CHECK, "-e", "check_vllm_window=%s" % value)
        assert rc != 0 and "check_vllm_window=%s" % value in flat(out) and "window=0.0" not in out, out
        assert "seconds" in flat(out), out


def test_no_instance_after_a_failed_one_is_touched(simnode, tmp_path):
    # Both instances change; a's new configuration crashes. a is rolled back, b keeps its server and its file.
    node = simnode(gpus=4, release_latency=0.2)
    ports = free_ports(2)
    inventory = inventory_file(tmp_path, node)
    a, b = instance("a", ports[0], [0, 1]), instance("b", ports[1], [2, 3])
    root = write_host_vars(tmp_path, node, [a, b])
    rc, out, _recap = run(inventory)
    assert rc == 0, out
    before_a, before_b, file_b = (
        server_tree(node, ports[0]),
        server_tree(node, ports[1]),
        (root / "etc" / "b.json").read_text(),
    )
    crash = dict(a["environment"], SIMVLLM_CRASH="1")
    write_host_vars(tmp_path, node, [dict(a, environment=crash), dict(b, gpu_memory_utilization=0.85)])
    rc, out, recap = run(inventory)
    assert rc != 0 and recap[node.name]["failed"] == 1, out
    lines = summary(out, node)
    assert lines[0].startswith("a (GPUs 0,1, ") and ": FAILED (configuration changed)" in lines[0], lines
    assert "not attempted after the failure above: b" in lines and not any(line.startswith("b (") for line in lines), (
        lines
    )
    assert server_tree(node, ports[1]) == before_b and (root / "etc" / "b.json").read_text() == file_b
    assert server_tree(node, ports[0]) != before_a  # a was stopped, then rolled back to its previous configuration
    assert "rolled back to the previous configuration" in out, out


def test_control_characters_headless_counts_and_config_files_are_refused_before_the_stop(simnode, tmp_path):
    # Issue 33 items 8 and 12: a newline in environment or extra_args would write its own ExecStartPre= into the unit
    # (and split the command line); --api-server-count 0 runs vLLM headless, with no API server to answer the ready
    # gate; --config FILE holds flags nothing checks. Each is refused by name, and the running server keeps its PIDs.
    node, inventory, port, _spare, tree = deployed(simnode, tmp_path)
    injected = "x\nExecStartPre=/bin/touch %s" % (tmp_path / "PWN")
    override = {
        "environment": {"SIMVLLM_LOAD_SECONDS": "0.3", "FOO": injected},
        "extra_args": ["--max-num-seqs=8\nExecStartPre=/bin/true", "-asc", "0", "--config", str(tmp_path / "c.yaml")],
    }
    text = refused(
        inventory,
        node,
        port,
        tree,
        {"test_override": override},
        r"instance a: environment\.FOO has a control character \(U\+000A\) at character 2",
        r"extra_args\[0\] has a control character \(U\+000A\)",
        r"extra_args has -asc \(--api-server-count\) with '0': --api-server-count must be a whole number of 1 or more",
        r"extra_args has --config: the role does not read that file",
    )
    assert "PWN" not in text and not (tmp_path / "PWN").exists(), text
    for count in (["--api-server-count", "-1"], ["--api-server-count=0"]):
        refused(
            inventory,
            node,
            port,
            tree,
            {"test_override": {"extra_args": count}},
            r"extra_args has --api-server-count with '(-1|0)': .*runs headless",
        )


def test_a_failed_rollback_shows_why_the_previous_configuration_did_not_start(simnode, tmp_path):
    # Issue 33 item 13: the new configuration crashes, and the previous one no longer starts either (its vLLM
    # executable now fails). The summary and the failure carry what the previous configuration wrote to its log.
    node = simnode(gpus=2, release_latency=0.2)
    port = free_ports(1)[0]
    inventory = inventory_file(tmp_path, node)
    vllm = node.state_dir / "bin" / "vllm"
    previous = tmp_path / "vllm-previous"
    previous.write_text('#!/bin/sh\nexec %s "$@"\n' % vllm)
    previous.chmod(0o755)
    a = instance("a", port, [0, 1], vllm_executable=str(previous))
    root = write_host_vars(tmp_path, node, [a])
    rc, out, _recap = run(inventory)
    assert rc == 0, out
    previous.write_text("#!/bin/sh\necho 'vllm-previous: error: no model at /models/gone (test)' >&2\nexit 2\n")
    crash = dict(a["environment"], SIMVLLM_CRASH="init", SIMVLLM_LOAD_SECONDS="2")
    write_host_vars(tmp_path, node, [dict(a, vllm_executable=str(vllm), environment=crash)])
    rc, out, recap = run(inventory)
    assert rc != 0 and recap[node.name]["failed"] == 1, out
    lines = summary(out, node)
    log = root / "log" / "a.log"
    assert any(line.startswith("  the rollback failed too: ") for line in lines), lines
    shown = lines[lines.index("  last lines the previous configuration wrote to %s when started again:" % log) + 1 :]
    assert "    vllm-previous: error: no model at /models/gone (test)" in shown, lines
    assert not any("illegal memory access" in line or "EngineCore" in line for line in shown), shown
    assert re.search(
        r"Last lines the previous configuration wrote to %s when started again:\n(.*\n)*"
        r"vllm-previous: error: no model at /models/gone \(test\)" % re.escape(str(log)),
        flat(out),
    ), out


def test_a_renamed_instance_is_refused_by_the_name_it_had(simnode, tmp_path):
    # Issue 33: a rename (same port, same API key) was refused as "(wrong or missing API key)": the look at a port
    # taken anew sends no key. The refusal now names the instance the role deployed on that port.
    node = simnode(gpus=2, release_latency=0.2)
    port = free_ports(1)[0]
    inventory = inventory_file(tmp_path, node)
    a = instance("a", port, [0, 1], api_key=API_KEY)
    root = write_host_vars(tmp_path, node, [a])
    rc, out, _recap = run(inventory)
    assert rc == 0, out
    tree = server_tree(node, port)
    write_host_vars(tmp_path, node, [dict(a, name="b")])
    text = refused(
        inventory,
        node,
        port,
        tree,
        {},
        r"instance b: port %d is used by instance a, deployed by this role \(%s\) and not in vllm_server_instances "
        r"\(renamed\?\): stop it first \(the session of the PID in %s\) and remove its files"
        % (port, re.escape(str(root / "etc" / "a.json")), re.escape(str(root / "state" / "a.pid"))),
    )
    assert "API key" not in text and API_KEY not in text, text
