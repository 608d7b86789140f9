"""vllm_server meets vLLM servers it did not start (issue 46): refused by name without vllm_server_adopt_unmanaged,
drained and replaced with it, on a simulated node.

The servers are started as operators start them, with nohup, a log file and a working directory of their own: one
`vllm serve` on instance a's port; on ports of their own, with engines and workers on instance b's GPUs, a launcher
of two API servers (`--api-server-count 2`) and vLLM's OpenAI server module (`python -m
vllm.entrypoints.openai.api_server`); on instance b's port and GPUs, a `vllm serve` still loading its model (it does
not listen yet: a server all the same, not a leftover). One node, four playbook runs (each start costs seconds on the
test machine): refused (nothing signalled), check mode (would drain and replace), replaced (b's new configuration fails to
start: its failure names what it replaced), then a second run that leaves a as it is and deploys b.
"""

from __future__ import annotations

import json
import re
import shlex
import urllib.error
import urllib.request

from nodetools import SIM_DIR, alive, processes, wait_for
from simnode import VENV_PYTHON, inventory_file
from test_vllm_server import GUESSED, SERVER_ENV, free_ports, instance, run, summary, write_host_vars


def answers(port):
    try:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def start_by_hand(node, directory, port, env, *args):
    """`cd DIRECTORY && ENV nohup vllm serve ARGS --port PORT > vllm.log 2>&1 &` in the node; returns the PIDs of the
    server's tree (its API server first) once it answers /health."""
    directory.mkdir()
    prefix = " ".join("%s=%s" % item for item in env.items())
    line = "cd %s && %s nohup vllm serve %s --port %d > vllm.log 2>&1 &" % (directory, prefix, " ".join(args), port)
    node.exec("sh", "-c", line)
    wait_for(lambda: answers(port), 60, 0.2, "the server started by hand to answer on port %d" % port)
    return _tree(node, "vllm serve", port)


def start_module_by_hand(node, directory, port, env, args):
    """`cd DIRECTORY && ENV nohup python -m vllm.entrypoints.openai.api_server ARGS --port PORT > api.log 2>&1 &`:
    vLLM's module, here a package of that name in DIRECTORY that runs the simulated vLLM's server. Returns the PIDs
    of the server's tree (its API server first) once it answers /health."""
    package = directory / "vllm" / "entrypoints" / "openai"
    package.mkdir(parents=True)
    for init in (directory / "vllm", directory / "vllm" / "entrypoints", package):
        (init / "__init__.py").write_text("")
    (package / "api_server.py").write_text(
        "import sys\nsys.path.insert(0, %r)\nfrom simvllm.cli import main\n"
        "sys.exit(main(['serve'] + sys.argv[1:]))\n" % str(SIM_DIR)
    )
    line = "cd %s && %s nohup %s -m vllm.entrypoints.openai.api_server %s --port %d --host 127.0.0.1 > api.log 2>&1 &"
    node.exec("sh", "-c", line % (directory, env, VENV_PYTHON, args, port))
    wait_for(lambda: answers(port), 60, 0.2, "the server module started by hand to answer on port %d" % port)
    return _tree(node, "vllm.entrypoints.openai.api_server", port)


def start_loading_by_hand(node, directory, port, env, args):
    """`cd DIRECTORY && ENV nohup vllm serve ARGS --port PORT > vllm.log 2>&1 &`, a model that loads for minutes;
    returns the PIDs of its tree (its API server first) once its workers hold their GPUs and the load began."""
    directory.mkdir()
    line = "cd %s && %s nohup vllm serve %s --port %d > vllm.log 2>&1 &" % (directory, env, args, port)
    node.exec("sh", "-c", line)
    log = directory / "vllm.log"
    wait_for(lambda: log.exists() and "Starting to load model" in log.read_text(), 60, 0.2, "the load to begin")
    assert not answers(port)
    return _tree(node, "vllm serve", port)


def _tree(node, command, port):
    procs = processes(node)
    api = [pid for pid, entry in procs.items() if command in entry[3] and "--port %d" % port in entry[3]]
    assert len(api) == 1, procs
    tree = list(api)
    for pid in tree:
        tree += sorted(child for child, entry in procs.items() if entry[0] == pid and entry[1] != "Z")
    return tree


def test_servers_started_by_hand_are_refused_by_name_then_drained_and_replaced(simnode, tmp_path):
    node = simnode(gpus=4, release_latency=0.2)
    port_a, port_b, port_hand, port_module = free_ports(4)
    inventory = inventory_file(tmp_path, node)
    b = dict(instance("b", port_b, [2, 3]), speculative_config=None)
    write_host_vars(
        tmp_path,
        node,
        [instance("a", port_a, [0, 1]), b],
        instance_b_crashing=dict(b, environment=dict(SERVER_ENV, SIMVLLM_CRASH="init", SIMVLLM_LOAD_SECONDS="3")),
        vllm_server_stop_timeout=10,
        vllm_server_kill_wait=5,
    )
    hand_env = dict(SERVER_ENV, VLLM_USE_V2_MODEL_RUNNER="1", SIMVLLM_VERSION="0.26")
    # The start: nohup vllm serve with the guessed DFlash settings, on a's port and GPUs 0-1 ...
    first = start_by_hand(
        node,
        tmp_path / "first",
        port_a,
        dict(hand_env, CUDA_VISIBLE_DEVICES="0,1"),
        "/models/Qwen3.6-27B",
        "--host 127.0.0.1 --served-model-name qwen-a --tensor-parallel-size 2",
        "--speculative-config",
        shlex.quote(json.dumps(GUESSED)),
    )
    # ... and a launcher of two API servers on a port of its own, whose engine and workers hold b's GPUs 2-3.
    second = start_by_hand(
        node,
        tmp_path / "second",
        port_hand,
        dict(SERVER_ENV, CUDA_VISIBLE_DEVICES="2,3"),
        "/models/Qwen3-8B --host 127.0.0.1 --tensor-parallel-size 2 --api-server-count 2 --gpu-memory-utilization 0.4",
    )
    # ... and, beside it on the same GPUs, vLLM's OpenAI server module run with `python -m` on a third port.
    third = start_module_by_hand(
        node,
        tmp_path / "third",
        port_module,
        "CUDA_VISIBLE_DEVICES=2,3 SIMVLLM_LOAD_SECONDS=0.3",
        "--model /models/Qwen3-0.6B --tensor-parallel-size 2 --gpu-memory-utilization 0.4",
    )
    # ... and a `vllm serve` on b's port and GPUs 2-3 that loads its model for longer than these runs.
    fourth = start_loading_by_hand(
        node,
        tmp_path / "fourth",
        port_b,
        "CUDA_VISIBLE_DEVICES=2,3 SIMVLLM_LOAD_SECONDS=600 VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS=1",
        "/models/Qwen3-0.6B --host 127.0.0.1 --tensor-parallel-size 2 --gpu-memory-utilization 0.05",
    )
    api_first, api_second, api_third, api_fourth = first[0], second[0], third[0], fourth[0]
    assert len(first) == 4 and len(second) == 6 and len(third) == 4 and len(fourth) == 4, processes(node)

    # Without the opt-in: refused before anything is signalled, each server named with the two ways on.
    rc, out, recap = run(inventory)
    out = out.replace("\\n", "\n")
    assert rc != 0 and recap[node.name]["changed"] == 0, out
    assert (
        "instance a: a vLLM server that this role did not start listens on its port %d: PID %d on port %d, serving "
        "/models/Qwen3.6-27B as qwen-a (tensor parallel 2, data parallel 1) on GPUs 0, 1. Nothing was signalled. To "
        "drain it and replace it with this instance, run again with -e vllm_server_adopt_unmanaged=true"
        % (port_a, api_first, port_a)
    ) in out, out
    assert all("kill -TERM %d" % pid in out for pid in (api_first, api_second, api_third)), out
    assert (
        "a vLLM server that this role did not start holds its GPUs 2, 3: PID %d on port %d, serving "
        "/models/Qwen3-0.6B (tensor parallel 2, data parallel 1) on GPUs 2, 3." % (api_third, port_module)
    ) in out, out
    assert (
        "instance b: a vLLM server that this role did not start holds its GPUs 2, 3: PID %d on port %d, serving "
        "/models/Qwen3-8B (tensor parallel 2, data parallel 1) on GPUs 2, 3." % (api_second, port_hand)
    ) in out, out
    assert (
        "a vLLM server that this role did not start is starting on its port %d: PID %d on port %d (still starting: not "
        "listening yet), serving /models/Qwen3-0.6B (tensor parallel 2, data parallel 1) on GPUs 2, 3. Nothing was "
        "signalled." % (port_b, api_fourth, port_b)
    ) in out, out
    assert "kill -TERM %d" % api_fourth in out, out
    assert all(alive(node, pid) for pid in first + second + third + fourth)

    # Check mode with the opt-in: what would be drained and replaced, by PID, port and command line.
    rc, out, recap = run(inventory, "--check", "-e", "vllm_server_adopt_unmanaged=true")
    assert rc == 0, out
    lines = summary(out, node)
    assert lines[0].startswith("a (GPUs 0,1, http://127.0.0.1:%d): would redeploy (" % port_a), lines
    assert "vLLM server PID %d not started by this role" % api_first in lines[0], lines
    replace = [line for line in lines if line.startswith("  would drain and replace")]
    assert len(replace) == 3, lines
    assert replace[0].startswith(
        "  would drain and replace the vLLM server PID %d on port %d that this role did not start: "
        % (api_first, port_a)
    ), lines
    assert re.search(r"bin/vllm serve /models/Qwen3\.6-27B .*--speculative-config '\{", replace[0]), lines
    assert "PID %d on port %d" % (api_second, port_hand) in replace[1], lines
    assert re.search(
        r"PID %d on port %d .*: \S+ -m vllm\.entrypoints\.openai\.api_server --model" % (api_third, port_module),
        replace[2],
    )
    assert (
        "  would stop and replace the vLLM server PID %d on port %d that this role did not start (still starting: not "
        "listening yet): " % (api_fourth, port_b)
    ) in "\n".join(lines), lines
    assert all(alive(node, pid) for pid in first + second + third + fourth)

    # With the opt-in: a replaces the first server (drained, SIGTERM: vLLM's shutdown runs, as its log says). b's
    # new configuration fails to start after the second server was stopped: the failure says how to start it again.
    override = {"vllm_server_instances": "{{ [instance_a, instance_b_crashing] }}", "vllm_server_adopt_unmanaged": True}
    rc, out, recap = run(inventory, "-e", json.dumps(override))
    assert rc != 0 and recap[node.name]["failed"] == 1, out
    lines = summary(out, node)
    assert lines[0].startswith("a (GPUs 0,1, http://127.0.0.1:%d): redeployed (" % port_a), lines
    text = "\n".join(lines)
    assert (
        "  drained and replaced the vLLM server PID %d on port %d that this role did not start: " % (api_first, port_a)
        in text
    ), lines
    assert re.search(r"\n    drained in [\d.]+ s: .*, server exited [\d.]+ s after SIGTERM\n", text), lines
    assert "Received signal 15, shutting down." in (tmp_path / "first" / "vllm.log").read_text()
    assert "Received signal 15, shutting down." in (tmp_path / "second" / "vllm.log").read_text()
    assert "Received signal 15, shutting down." in (tmp_path / "third" / "api.log").read_text()
    assert not any(alive(node, pid) for pid in first + second + third + fourth)
    assert re.search(
        r"\n  stopped and replaced the vLLM server PID %d on port %d that this role did not start \(still starting: "
        r"not listening yet\): .*\n    SIGTERM to its API server: its tree exited after [\d.]+ s\n"
        % (api_fourth, port_b),
        text,
    ), lines
    assert re.search(r"acceptance rate [\d.]+%", text), lines
    failure = out.replace("\\n", "\n")
    assert (
        "The vLLM server PID %d that this role did not start was stopped for this instance and is not started again"
        % api_second
    ) in failure, failure
    assert "It ran in %s with output to %s:" % (tmp_path / "second", tmp_path / "second" / "vllm.log") in failure
    assert re.search(
        r"cd %s && CUDA_VISIBLE_DEVICES=2,3 nohup \S+ \S+/vllm serve /models/Qwen3-8B " % (tmp_path / "second"), failure
    ), failure

    # The next run: a is unchanged, nothing is left to replace, and b is deployed as a first deployment.
    rc, out, recap = run(inventory, "-e", "vllm_server_adopt_unmanaged=true")
    assert rc == 0, out
    lines = summary(out, node)
    assert lines[0] == "a (GPUs 0,1, http://127.0.0.1:%d): unchanged" % port_a, lines
    assert lines[1] == "b (GPUs 2,3, http://127.0.0.1:%d): redeployed (configuration changed, not running)" % port_b
    assert not any("replace" in line or "did not start" in line for line in lines), lines
