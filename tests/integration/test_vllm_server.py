"""roles/vllm_server and playbooks/redeploy_vllm.yml end to end on simulated nodes running the simulated vLLM.

Every directory the role writes (configuration, state, logs, units) is under tmp_path: nodes share the host's
filesystem. Nodes also share the host's network, so each instance gets its own free loopback port.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import textwrap

from ansible_run import REPO, module, only, playbook
from nodetools import alive, gpu_memory, processes, start_vllm, vllm_tree, wait_for
from ports import free_ports  # noqa: F401  (reserved per test process; the other test_vllm_* files import it from here)
from simnode import inventory_file

PLAYBOOK = REPO / "playbooks" / "redeploy_vllm.yml"
DRAFTER = str(REPO / "tests" / "fixtures" / "drafters" / "dflash-qwen3")
# The target model's directory (the role checks that a model given as an absolute path exists; the simulator loads nothing).
MODEL = str(REPO / "tests" / "fixtures" / "models" / "Qwen3.6-27B")
SLIDING, FULL = "sliding_attention", "full_attention"
# The reported hand-made redeploy: guessed taps, mask token and attention layout (acceptance 0.8%).
GUESSED = {
    "method": "dflash",
    "model": DRAFTER,
    "num_speculative_tokens": 15,
    "target_layer_ids": [1, 17, 33, 49, 63],
    "mask_token_id": 248064,
    "layer_types": [FULL] * 5,
}
# What the drafter's config.json defines, stated so that the role checks it.
CORRECTED = {
    "method": "dflash",
    "model": DRAFTER,
    "target_layer_ids": [1, 16, 31, 46, 61],
    "mask_token_id": 248070,
    "layer_types": [SLIDING] * 4 + [FULL],
}
API_KEY = "sk-test-4f1c9b2e-do-not-log"
SERVER_ENV = {"SIMVLLM_LOAD_SECONDS": "0.3"}
WARMUP = ["the GPU holds a context while vLLM serves tokens", "operators poll every handle"]


def instance(name, port, gpus, speculative_config=None, **extra):
    """An instance of vllm_server_instances on loopback, with the corrected DFlash config unless another is given."""
    return dict(
        {
            "name": name,
            "model": MODEL,
            "served_model_name": "qwen-" + name,
            "host": "127.0.0.1",
            "port": port,
            "gpus": gpus,
            "speculative_config": speculative_config or CORRECTED,
            "environment": dict(SERVER_ENV),
        },
        **extra,
    )


def write_host_vars(tmp_path, node, instances, **variables):
    """host_vars/<node>.yml next to the inventory: fast timings, every directory under tmp_path/<node>.

    Each instance is also a variable instance_<name>; vllm_server_instances lists them all, with the extra
    variables test_override (a dict) and test_override_by_host[<node>] combined into each, so one run can change them.
    """
    root = tmp_path / node.name
    host_vars = {
        "vllm_server_config_dir": str(root / "etc"),
        "vllm_server_state_dir": str(root / "state"),
        "vllm_server_log_dir": str(root / "log"),
        "vllm_server_systemd_dir": str(root / "units"),
        "vllm_server_vllm_executable": str(node.state_dir / "bin" / "vllm"),
        "vllm_server_stop_timeout": 10,
        "vllm_server_ready_timeout": 60,
        "vllm_server_ready_poll_interval": 0.3,
        "vllm_server_gpu_release_timeout": 30,
        "vllm_server_warmup_prompts": WARMUP,
        "vllm_server_warmup_max_tokens": 48,
        "vllm_server_instances": "{{ [%s] }}"
        % ", ".join(
            "instance_%s | combine(test_override | default({})) | combine((test_override_by_host | default({}))"
            ".get(inventory_hostname, {}))" % item["name"]
            for item in instances
        ),
    }
    host_vars.update(("instance_" + item["name"], item) for item in instances)
    host_vars.update(variables)
    (tmp_path / "host_vars").mkdir(exist_ok=True)
    (tmp_path / "host_vars" / (node.name + ".yml")).write_text(json.dumps(host_vars, indent=1))
    return root


def server_tree(node, port):
    """{"api": PID, "engine": PID, "workers": [PIDs]} of the vllm serve listening on `port` (its API server alive)."""
    procs = processes(node)
    api = [
        pid
        for pid, (_ppid, state, _comm, cmd) in procs.items()
        if state != "Z" and "vllm serve" in cmd and re.search(r"--port %d\b" % port, cmd)
    ]
    assert len(api) == 1, (port, procs)
    engines = [pid for pid, entry in procs.items() if entry[0] == api[0] and entry[3].startswith("VLLM::EngineCore")]
    assert len(engines) == 1, (port, procs)
    workers = sorted(
        pid for pid, entry in procs.items() if entry[0] == engines[0] and entry[3].startswith("VLLM::Worker_TP")
    )
    return {"api": api[0], "engine": engines[0], "workers": workers}


def tree_pids(tree):
    return [tree["api"], tree["engine"]] + tree["workers"]


def environ(node, pid):
    """Environment of process `pid` in the node, as a dict."""
    raw = node.exec("cat", "/proc/%d/environ" % pid).stdout
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def summary(output, node):
    """The role's summary lines for `node` (the debug task's msg list)."""
    match = re.search(
        r"TASK \[gpuops\.nvidia\.vllm_server : Summarize the deployment\].*?\n(?:ok|fatal): \[%s\] => (\{.*?\n\})"
        % re.escape(node.name),
        output,
        re.S,
    )
    assert match, output
    return json.loads(match.group(1))["msg"]


def run(inventory, *args):
    """ansible-playbook playbooks/redeploy_vllm.yml: (returncode, output, recap)."""
    return playbook(inventory, PLAYBOOK, *args, timeout=400)


def test_redeploy_from_guessed_dflash_config_to_corrected(simnode, tmp_path):
    nodes = [simnode(gpus=8, release_latency=0.2) for _number in range(2)]
    ports = free_ports(4)
    inventory = inventory_file(tmp_path, *nodes)
    roots = {}
    for node, (port_a, port_b) in zip(nodes, (ports[:2], ports[2:])):
        roots[node.name] = write_host_vars(
            tmp_path,
            node,
            [instance("a", port_a, [0, 1, 2, 3], api_key=API_KEY), instance("b", port_b, [4, 5, 6, 7])],
            instance_a_guessed=instance("a", port_a, [0, 1, 2, 3], GUESSED),
            port_a=port_a,
        )

    # Before: each node runs a vLLM started by hand with the guessed DFlash config on GPUs 0-3 ...
    hand_started = {}
    for node, port_a in zip(nodes, (ports[0], ports[2])):
        guessed_flag = shlex.quote(json.dumps(GUESSED))
        hand_started[node.name] = start_vllm(
            node,
            "/models/Qwen3.6-27B",
            "--host",
            "127.0.0.1",
            "--port",
            str(port_a),
            "--served-model-name",
            "qwen-a",
            "--tensor-parallel-size",
            "4",
            "--speculative-config",
            guessed_flag,
            # vLLM 0.33 refuses the guessed keys in --speculative-config; the simulator's pre-0.33 mode lets them
            # override the drafter's config.json, standing for a hand-edited drafter (tests/sim/simvllm/README.md).
            env=dict(SERVER_ENV, CUDA_VISIBLE_DEVICES="0,1,2,3", VLLM_USE_V2_MODEL_RUNNER="1", SIMVLLM_VERSION="0.26"),
        )
    # ... whose acceptance has collapsed, as the gate measures it,
    url_a = {"url": "http://127.0.0.1:{{ port_a }}", "served_model_name": "qwen-a"}
    for status, result in module(inventory, "gpuops.nvidia.vllm_ready", dict(url_a, timeout=30)).values():
        assert status == "SUCCESS", result
    for status, result in module(
        inventory, "gpuops.nvidia.vllm_acceptance", dict(url_a, prompts=WARMUP, max_tokens=48)
    ).values():
        assert status == "SUCCESS" and result["acceptance_rate"] < 0.05, result
    # ... and instance b, deployed by the role on GPUs 4-7.
    rc, out, recap = run(inventory, "-e", '{"vllm_server_instances": "{{ [instance_b] }}", "vllm_server_serial": 2}')
    assert rc == 0, out
    b_before = {node.name: server_tree(node, port_b) for node, port_b in zip(nodes, (ports[1], ports[3]))}
    # The operator SIGKILLs the hand-started API server: EngineCore and the 4 workers are orphaned, holding GPUs 0-3.
    orphans, orphan_workers = {}, {}
    for node in nodes:
        node.exec("kill", "-9", str(hand_started[node.name]))
        wait_for(lambda: not alive(node, hand_started[node.name]), 10, what="API server gone")
        engines, workers = vllm_tree(node)
        orphan_workers[node.name] = sorted(set(workers) - set(b_before[node.name]["workers"]))
        orphans[node.name] = sorted(set(engines) - {b_before[node.name]["engine"]}) + orphan_workers[node.name]
        assert len(orphans[node.name]) == 5 and len(orphan_workers[node.name]) == 4
        assert [used > 60000 for used, _pids in gpu_memory(node)] == [True] * 8

    # Redeploying with the guessed values fails validation, field by field, before anything is touched.
    rc, out, recap = run(
        inventory, "-e", '{"vllm_server_instances": "{{ [instance_a_guessed, instance_b] }}", "vllm_server_serial": 2}'
    )
    assert rc != 0 and all(recap[node.name]["failed"] == 1 and recap[node.name]["changed"] == 0 for node in nodes), out
    for field, requested, drafter in (
        ("target_layer_ids", "[1, 17, 33, 49, 63]", "[1, 16, 31, 46, 61]"),
        ("mask_token_id", "248064", "248070"),
        ("layer_types", FULL, SLIDING),
    ):
        assert re.search(
            r"%s: requested [^\n]*%s[^\n]*drafter[^\n]*%s" % (field, re.escape(requested), re.escape(drafter)),
            out.replace("\\n", "\n"),
        ), (field, out)
    for node in nodes:
        assert all(alive(node, pid) for pid in orphans[node.name] + tree_pids(b_before[node.name]))

    # The corrected config: orphans ended on GPUs 0-3 only, new server healthy and gated, b untouched.
    # Verbose (-vv: module arguments and results), the API key is still never shown.
    rc, out, recap = run(inventory, "-vv", "-e", "vllm_server_serial=2")
    assert rc == 0, out
    assert API_KEY not in out, out[max(0, out.find(API_KEY) - 2000) : out.find(API_KEY) + 200]
    for node, port_a, port_b in zip(nodes, (ports[0], ports[2]), (ports[1], ports[3])):
        lines = summary(out, node)
        # Changed: a's files written, the orphans on its GPUs ended, its server started (b is left alone).
        assert recap[node.name]["failed"] == 0 and recap[node.name]["changed"] == 3, out
        assert not any(alive(node, pid) for pid in orphans[node.name])
        assert server_tree(node, port_b) == b_before[node.name], "instance b was touched"
        new_a = server_tree(node, port_a)
        assert len(new_a["workers"]) == 4 and not set(tree_pids(new_a)) & set(orphans[node.name])
        assert [used > 60000 for used, _pids in gpu_memory(node)] == [True] * 8
        assert lines[0].startswith("a (GPUs 0,1,2,3, http://127.0.0.1:%d): redeployed" % port_a), lines
        # gpu_kill ended the orphaned workers (the GPU holders); their EngineCore, holding no GPU, exited with them.
        ended = re.search(r"ended 4 process\(es\) left on its GPUs: (.*)", "\n".join(lines))
        assert ended and sorted(int(p.split()[0]) for p in ended.group(1).split(", ")) == orphan_workers[node.name], (
            lines
        )
        rate = re.search(r"acceptance rate ([\d.]+)%", "\n".join(lines))
        assert rate and float(rate.group(1)) >= 60, lines
        assert "b (GPUs 4,5,6,7, http://127.0.0.1:%d): unchanged" % port_b in lines
        # The API key reaches the server through its environment file only: never on a command line.
        key_file = roots[node.name] / "etc" / "a.env"
        assert key_file.read_text() == "VLLM_API_KEY=%s\n" % API_KEY and (key_file.stat().st_mode & 0o777) == 0o600
        assert all(API_KEY not in entry[3] for entry in processes(node).values())
        env = environ(node, new_a["api"])
        assert env["VLLM_API_KEY"] == API_KEY and env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
        assert env["VLLM_USE_V2_MODEL_RUNNER"] == "1"
        config = json.loads((roots[node.name] / "etc" / "a.json").read_text())
        assert config["speculative_config"] == {"method": "dflash", "model": DRAFTER, "num_speculative_tokens": 15}
        assert API_KEY not in json.dumps(config)

    # A second run changes nothing and restarts nothing.
    trees = {node.name: processes(node) for node in nodes}
    rc, out, recap = run(inventory, "-e", "vllm_server_serial=2")
    assert rc == 0 and all(recap[node.name]["changed"] == 0 for node in nodes), out
    for node in nodes:
        assert processes(node).keys() >= {pid for pid, entry in trees[node.name].items() if "vllm" in entry[3].lower()}
        assert [line.split(": ")[-1] for line in summary(out, node)] == ["unchanged", "unchanged"]


def test_failed_configurations_are_rolled_back_and_stop_the_rollout(simnode, tmp_path):
    nodes = [simnode(gpus=4, release_latency=0.2) for _number in range(2)]
    ports = free_ports(2)
    inventory = inventory_file(tmp_path, *nodes)
    roots = {
        node.name: write_host_vars(tmp_path, node, [instance("a", port, [0, 1, 2, 3])])
        for node, port in zip(nodes, ports)
    }
    rc, out, recap = run(inventory, "-e", "vllm_server_serial=2")
    assert rc == 0, out
    deployed = {
        node.name: (server_tree(node, port), (roots[node.name] / "etc" / "a.json").read_text())
        for node, port in zip(nodes, ports)
    }

    # Check mode with diff: the change is shown, nothing is restarted or written.
    rc, out, recap = run(inventory, "--check", "--diff", "-e", '{"test_override": {"gpu_memory_utilization": 0.85}}')
    assert rc == 0 and all(recap[node.name]["changed"] == 1 for node in nodes), out
    assert '-  "gpu_memory_utilization": 0.9,\n+  "gpu_memory_utilization": 0.85,' in out
    assert "a (GPUs 0,1,2,3, http://127.0.0.1:%d): would redeploy (configuration changed)" % ports[0] in out
    for node, port in zip(nodes, ports):
        assert (server_tree(node, port), (roots[node.name] / "etc" / "a.json").read_text()) == deployed[node.name]

    # In one batch of both hosts: the first gets a configuration whose engine crashes after loading, the second a
    # good one. The first is rolled back; the second completes its redeploy; the play fails.
    first, second = nodes
    # The crashing server loads for 6 s, so that the readiness check's first look finds it still alive on a loaded
    # machine. With 0.3 s it was gone before that look ("is not running" instead of "exited after"). Its engine
    # fails before it reports ready (SIMVLLM_CRASH=init, as vLLM fails in its KV cache set-up): with a crash just
    # after ready, a readiness look could pass in the moment between the two, and the failure then came from the
    # acceptance gate (twice in full CI runs).
    crash = {
        first.name: {"environment": dict(SERVER_ENV, SIMVLLM_CRASH="init", SIMVLLM_LOAD_SECONDS="6")},
        second.name: {"gpu_memory_utilization": 0.85},
    }
    rc, out, recap = run(inventory, "-e", json.dumps({"test_override_by_host": crash, "vllm_server_serial": 2}))
    assert rc != 0 and recap[first.name]["failed"] == 1 and recap[second.name]["failed"] == 0, out
    assert "the server process (PID" in out and "exited after" in out, out
    assert "RuntimeError: CUDA error: an illegal memory access was encountered" in out
    assert "rolled back to the previous configuration, healthy again after" in out
    restored = server_tree(first, ports[0])
    assert restored["api"] != deployed[first.name][0]["api"] and len(restored["workers"]) == 4
    assert "SIMVLLM_CRASH" not in environ(first, restored["api"])
    assert (roots[first.name] / "etc" / "a.json").read_text() == deployed[first.name][1]
    assert "a (GPUs 0,1,2,3, http://127.0.0.1:%d): redeployed (configuration changed)" % ports[1] in summary(
        out, second
    )
    assert json.loads((roots[second.name] / "etc" / "a.json").read_text())["gpu_memory_utilization"] == 0.85
    redeployed = (server_tree(second, ports[1]), (roots[second.name] / "etc" / "a.json").read_text())
    assert redeployed[0]["api"] != deployed[second.name][0]["api"]
    status, ready = module(
        inventory,
        "gpuops.nvidia.vllm_ready",
        {"url": "http://127.0.0.1:%d" % ports[0], "served_model_name": "qwen-a", "timeout": 0},
    )[first.name]
    assert status == "SUCCESS" and ready["ready"], ready

    # One host per batch: a configuration that starts but misses the acceptance gate is rolled back on the first
    # host, and the second host's batch never starts.
    gate = {"gpu_memory_utilization": 0.8, "min_acceptance_rate": 0.95}
    rc, out, recap = run(inventory, "-e", json.dumps({"test_override": gate}))
    assert rc != 0 and recap[first.name]["failed"] == 1 and second.name not in recap, out
    assert re.search(r"acceptance rate [\d.]+% \(\d+ of \d+ draft tokens\).* is below the minimum 95\.0%", out), out
    assert "rolled back to the previous configuration" in out
    assert (roots[first.name] / "etc" / "a.json").read_text() == deployed[first.name][1]
    assert len(server_tree(first, ports[0])["workers"]) == 4
    assert (server_tree(second, ports[1]), (roots[second.name] / "etc" / "a.json").read_text()) == redeployed


def test_speculative_config_module_rejects_the_guessed_values_field_by_field(simnode, tmp_path):
    node = simnode(gpus=1)
    status, result = only(
        module(inventory_file(tmp_path, node), "gpuops.nvidia.vllm_speculative_config", {"speculative_config": GUESSED})
    )
    assert status == "FAILED!", result
    mismatches = {m["field"]: (m["requested"], m["drafter"]) for m in result["mismatches"]}
    assert mismatches == {
        "target_layer_ids": ([1, 17, 33, 49, 63], [1, 16, 31, 46, 61]),
        "mask_token_id": (248064, 248070),
        "layer_types": ([FULL] * 5, [SLIDING] * 4 + [FULL]),
    }, result
    for field in mismatches:
        assert field in result["msg"]


def test_systemd_unit_passes_systemd_analyze_verify(simnode, tmp_path):
    node = simnode(gpus=8)
    port = free_ports(1)[0]
    root = write_host_vars(
        tmp_path,
        node,
        [
            instance(
                "a",
                port,
                [0, 1, 2, 3],
                api_key=API_KEY,
                max_model_len=32768,
                extra_args=["--enforce-eager"],
                environment={"HF_HOME": "/srv/hf cache", "NOTE": "100% $HOME"},
            )
        ],
        vllm_server_service_manager="systemd",
    )
    render = tmp_path / "render.yml"
    render.write_text(
        textwrap.dedent("""\
        - name: Render the vLLM units
          hosts: all
          gather_facts: false
          tasks:
            - name: Render
              ansible.builtin.include_role:
                name: gpuops.nvidia.vllm_server
                tasks_from: render
        """)
    )
    rc, out, _recap = playbook(inventory_file(tmp_path, node), render)
    assert rc == 0, out
    assert not any("vllm serve" in entry[3] for entry in processes(node).values())
    unit = root / "units" / "vllm-a.service"
    text = unit.read_text()
    assert "KillMode=control-group" in text and "TimeoutStopSec=10" in text
    assert "EnvironmentFile=%s" % (root / "etc" / "a.env") in text and API_KEY not in text
    assert 'Environment="NOTE=100%% $HOME"' in text and 'Environment="HF_HOME=/srv/hf cache"' in text
    exec_start = re.search(r"^ExecStart=(.*)$", text, re.M).group(1)
    config = json.loads((root / "etc" / "a.json").read_text())
    assert shlex.split(exec_start) == config["argv"] and "--speculative-config" in config["argv"]
    verify = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, SYSTEMD_LOG_LEVEL="notice"),
        check=False,
    )
    assert verify.returncode == 0 and unit.name not in verify.stdout + verify.stderr, verify
