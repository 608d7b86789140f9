"""roles/vllm_server on MIG instances (issue 13) on a simulated node whose GPU 0 is split into MIG instances.

Two vLLM instances run on two MIG instances of the same GPU (CUDA_VISIBLE_DEVICES=MIG-<UUID>: the simulated vLLM
holds the parent's /dev/nvidia0 and the instance's /dev/nvidia-caps files, and the driver lists it on the parent with
the instance's ids; tests/sim/README.md "MIG"). Redeploying one must leave the other's processes and memory alone;
check_gpus and the reset_gpus report must say which instance holds what.
"""

from __future__ import annotations

import json
import re

from ansible_run import REPO, module, only, playbook
from nodetools import alive, device_fds, processes
from simnode import inventory_file
from test_vllm_server import environ, free_ports, instance, run, server_tree, summary, tree_pids, write_host_vars

CHECK = REPO / "playbooks" / "check_gpus.yml"
RESET = REPO / "playbooks" / "reset_gpus.yml"


def mig_view(inventory):
    """{GPU instance id: MIG device facts} of GPU 0, and the driver's process entries of GPU 0."""
    status, result = only(module(inventory, "gpuops.nvidia.gpu_facts"))
    assert status == "SUCCESS", result
    gpu = result["ansible_facts"]["nvidia"]["gpus"][0]
    return {device["gpu_instance_id"]: device for device in gpu["mig_devices"]}, gpu["driver_processes"]


def test_redeploy_on_one_mig_instance_leaves_the_neighbour_instance_alone(simnode, tmp_path):
    node = simnode(gpus=1, mig="0", release_latency=0.2)  # GIs 2 (3g.40gb), 4 (2g.20gb), 7 (1g.10gb)
    inventory = inventory_file(tmp_path, node)
    by_gi, _entries = mig_view(inventory)
    uuid = {gi: device["uuid"] for gi, device in by_gi.items()}
    port_a, port_b, port_c = free_ports(3)
    write_host_vars(
        tmp_path,
        node,
        [instance("a", port_a, [uuid[4]]), instance("b", port_b, [uuid[2]])],
        instance_a_changed=instance("a", port_a, [uuid[4]], gpu_memory_utilization=0.8),
        # Refused: the whole GPU in MIG mode (CUDA would use one of its instances, a stop would end all),
        # and a MIG instance beside another GPU entry (CUDA enumerates one MIG device per process).
        instance_whole=instance("whole", port_c, [0]),
        instance_two=instance("two", port_c + 1 if port_c < 65535 else port_c - 1, [uuid[7], uuid[2]]),
    )

    rc, out, recap = run(inventory)
    assert rc == 0, out
    a, b = server_tree(node, port_a), server_tree(node, port_b)
    assert environ(node, a["api"])["CUDA_VISIBLE_DEVICES"] == uuid[4]
    assert environ(node, b["api"])["CUDA_VISIBLE_DEVICES"] == uuid[2]
    assert "a (GPUs %s, http://127.0.0.1:%d): redeployed" % (uuid[4], port_a) in "\n".join(summary(out, node))
    by_gi, entries = mig_view(inventory)
    # 0.9 of each instance's memory (2g.20gb: 20096 MiB, 3g.40gb: 40448 MiB), held by each EngineCore (TP=1).
    assert {gi: (d["holder_pids"], d["memory_used_mib"]) for gi, d in by_gi.items()} == {
        2: ([b["engine"]], int(0.9 * 40448)),
        4: ([a["engine"]], int(0.9 * 20096)),
        7: ([], 0),
    }
    assert sorted((e["pid"], e["gpu_instance_id"], e["compute_instance_id"]) for e in entries) == sorted(
        [(a["engine"], 4, 0), (b["engine"], 2, 0)]
    )
    caps = {
        gi: ["/dev/nvidia-caps/nvidia-cap%d" % minor for minor in i["caps"]]
        for gi, i in ((i["gi"], i) for i in node.info["mig"]["0"])
    }
    a_files = {path for path, _position in device_fds(node, a["engine"])}
    assert set(caps[4]) | {"/dev/nvidia0"} <= a_files and not set(caps[2]) & a_files, a_files

    # Check mode: the change of a is announced, nothing restarts.
    changed = '{"vllm_server_instances": "{{ [instance_a_changed, instance_b] }}"}'
    rc, out, recap = run(inventory, "--check", "-e", changed)
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert "a (GPUs %s, http://127.0.0.1:%d): would redeploy (configuration changed)" % (uuid[4], port_a) in out
    assert (server_tree(node, port_a), server_tree(node, port_b)) == (a, b)

    # Refused before anything is touched.
    rc, out, recap = run(
        inventory, "-e", '{"vllm_server_instances": "{{ [instance_a, instance_b, instance_whole, instance_two] }}"}'
    )
    assert rc != 0 and recap[node.name]["changed"] == 0, out
    flat = out.replace("\\n", " ")
    assert re.search(r"instance whole: .*GPUs \['0'\] are also used by another instance", flat), out
    assert re.search(r"instance whole: .*GPU 0 is in MIG mode: CUDA would run on one of its MIG instances", flat), out
    assert re.search(r"instance two: .*a MIG instance must be the only GPU of a vLLM instance", flat), out
    # b's MIG instance, and GPU 0 that "whole" takes whole.
    assert "instance two: GPUs ['%s', '0'] are also used by another instance" % uuid[2] in flat, out
    assert "instance a: GPUs ['0'] are also used by another instance" in flat, out
    assert (server_tree(node, port_a), server_tree(node, port_b)) == (a, b)

    # The redeploy of a: stopped, its instance freed and waited for, started again; b keeps its PIDs and memory.
    b_memory = by_gi[2]["memory_used_mib"]
    rc, out, recap = run(inventory, "-e", changed)
    assert rc == 0, out
    lines = summary(out, node)
    assert lines[0].startswith(
        "a (GPUs %s, http://127.0.0.1:%d): redeployed (configuration changed)" % (uuid[4], port_a)
    ), lines
    assert "b (GPUs %s, http://127.0.0.1:%d): unchanged" % (uuid[2], port_b) in lines
    new_a = server_tree(node, port_a)
    assert not set(tree_pids(new_a)) & set(tree_pids(a)) and not any(alive(node, pid) for pid in tree_pids(a))
    assert server_tree(node, port_b) == b and all(alive(node, pid) for pid in tree_pids(b))
    by_gi, _entries = mig_view(inventory)
    assert {gi: (d["holder_pids"], d["memory_used_mib"]) for gi, d in by_gi.items()} == {
        2: ([b["engine"]], b_memory),
        4: ([new_a["engine"]], int(0.8 * 20096)),
        7: ([], 0),
    }

    # Idempotent: a second run changes and restarts nothing.
    before = processes(node)
    rc, out, recap = run(inventory, "-e", changed)
    assert rc == 0 and recap[node.name]["changed"] == 0, out
    assert [line.split(": ")[-1] for line in summary(out, node)] == ["unchanged", "unchanged"]
    assert {pid for pid, entry in before.items() if "vllm" in entry[3].lower()} <= processes(node).keys()

    # check_gpus: the free instance passes; the whole GPU fails and the host's line names the instances in use.
    rc, out, _recap = playbook(inventory, CHECK, "-e", json.dumps({"check_gpus_gpus": [uuid[7]]}))
    assert rc == 0 and "check_gpus %s: GPUs free (1 checked)" % node.name in out, out
    rc, out, _recap = playbook(inventory, CHECK)
    assert rc != 0, out
    (line,) = set(re.findall(r"check_gpus %s: not free: [^\"]*" % re.escape(node.name), out))
    expected = (
        "MIG instances in use: GPU 0 MIG instance %s (3g.40gb): %d MiB used, held by PID %d; GPU 0 MIG instance %s "
        "(2g.20gb): %d MiB used, held by PID %d"
        % (uuid[2], b_memory, b["engine"], uuid[4], int(0.8 * 20096), new_a["engine"])
    )
    assert expected in line, line
    assert uuid[7] not in line
    rc, out, _recap = playbook(inventory, CHECK, "-e", json.dumps({"check_gpus_gpus": [uuid[4]]}))
    assert rc != 0 and "GPU 0 MIG instance %s (2g.20gb)" % uuid[4] in out and uuid[2] not in out, out

    # A reset of a's instance: only a's server ends; the report has the figures per instance.
    reports = tmp_path / "reports"
    rc, out, recap = playbook(
        inventory,
        RESET,
        "-e",
        json.dumps({"reset_gpus_gpus": [uuid[4]], "reset_gpus_timeout": 20, "reset_gpus_report_dir": str(reports)}),
    )
    assert rc == 0 and recap[node.name]["changed"] > 0, out
    assert not alive(node, new_a["engine"]) and server_tree(node, port_b) == b
    (report,) = [json.loads(path.read_text()) for path in reports.iterdir()]
    assert report["mig_instances"] == {"0": [uuid[4]]}, report
    figures = {d["uuid"]: (d["memory_used_mib"], d["holder_pids"]) for d in report["gpus_after"][0]["mig_devices"]}
    assert figures == {uuid[2]: (b_memory, [b["engine"]]), uuid[4]: (0, []), uuid[7]: (0, [])}, figures
    before = {d["uuid"]: d["holder_pids"] for d in report["gpus_before"][0]["mig_devices"]}
    assert before[uuid[4]] == [new_a["engine"]], before
