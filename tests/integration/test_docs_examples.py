"""docs/: every example playbook under docs/examples/<page>/ works as its page says, and the pages are current.

Each example runs unchanged with ansible-playbook against a simulated GPU node, reached through the
group `gpu_servers` the examples use. The only difference from a GPU server: the inventory sets
ansible_become=false (these machines have no sudo; the tests run as root anyway).
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from ansible_run import REPO, playbook
from nodetools import alive, gpu_memory, start_holder, start_vllm, vllm_tree, wait_for
from ports import free_ports
from simnode import inventory_file

EXAMPLES = REPO / "docs" / "examples"
DRAFTERS = REPO / "tests" / "fixtures" / "drafters"
EXAMPLES_RUN: set[str] = set()


def _load_render_docs():
    spec = importlib.util.spec_from_file_location("render_docs", REPO / "scripts" / "render_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


render_docs = _load_render_docs()


def runs_examples(*relative: str):
    """Mark a test as the one that runs these docs/examples/ files; it gets their paths as `examples`."""
    EXAMPLES_RUN.update(relative)
    return pytest.mark.parametrize("examples", [[EXAMPLES / name for name in relative]], ids=["+".join(relative)])


def example_inventory(tmp_path, node):
    """The node's inventory, with the node also in group gpu_servers and without become."""
    path = inventory_file(tmp_path, node)
    path.write_text(
        path.read_text() + "\n[gpu_servers:children]\ngpunodes\n\n[gpu_servers:vars]\nansible_become=false\n"
    )
    return path


def orphan_vllm(node, gpus):
    """Start `vllm serve` with tensor parallelism over `gpus` and SIGKILL its API server, as an operator's
    `kill -9` does; return (EngineCore PID, [TP worker PIDs]) left behind, the workers holding the GPUs.

    EngineCore holds no GPU; it exits by itself once its workers are gone (vLLM's worker monitor)."""
    api = start_vllm(
        node,
        "/models/m",
        "--tensor-parallel-size",
        str(len(gpus)),
        env={"CUDA_VISIBLE_DEVICES": ",".join(str(gpu) for gpu in gpus)},
    )
    node.exec("kill", "-9", str(api))
    wait_for(lambda: not alive(node, api), 10, what="the API server gone")
    engines, workers = vllm_tree(node)
    assert len(engines) == 1 and len(workers) == len(gpus)
    return engines[0], workers


def assert_ended(node, engine, workers):
    """The workers are gone, and EngineCore follows them."""
    assert not any(alive(node, pid) for pid in workers)
    wait_for(lambda: not alive(node, engine), 10, what="EngineCore %d to exit after its workers" % engine)


def free_port():
    """A TCP port free on the loopback interface, reserved for this test process (nodes share the host's network)."""
    return free_ports(1)[0]


def test_every_example_is_run_by_a_test():
    on_disk = {str(path.relative_to(EXAMPLES)) for path in EXAMPLES.glob("*/*.yml")}
    assert on_disk == EXAMPLES_RUN


def test_pages_are_current_and_quote_their_examples():
    problems = render_docs.problems()
    assert not problems, "run .venv/bin/python scripts/render_docs.py:\n" + "\n".join(problems)


@runs_examples("gpu_facts/show_holders.yml")
def test_show_holders(simnode, tmp_path, examples):
    [example] = examples
    node = simnode(gpus=2, release_latency=0.1)
    holder = start_holder(node, [1], mib=3000, title="VLLM::EngineCore")
    rc, out, recap = playbook(example_inventory(tmp_path, node), example)
    assert rc == 0 and recap[node.name]["changed"] == 0, out
    assert "GPU 0 (NVIDIA H100 80GB HBM3): 0 of 81559 MiB used, held by [], 0 MiB explained by no process" in out, out
    assert "GPU 1 (NVIDIA H100 80GB HBM3): 3000 of 81559 MiB used, held by [%d], 0 MiB" % holder in out, out


@runs_examples("gpu_kill/end_vllm_on_gpus.yml")
def test_end_vllm_on_gpus(simnode, tmp_path, examples):
    [example] = examples
    node = simnode(gpus=4, release_latency=0.1)
    engine, workers = orphan_vllm(node, [0, 1])
    trainer = start_holder(node, [1], mib=1000)  # GPU 1, not vLLM
    other_server = start_holder(node, [2], mib=1000, title="vllm serve /models/other")  # vLLM, GPU 2
    inventory = example_inventory(tmp_path, node)

    rc, out, recap = playbook(inventory, example)
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert_ended(node, engine, workers)
    assert alive(node, trainer) and alive(node, other_server)
    for pid in workers:
        assert re.search(r"%d VLLM::\S+: SIGTERM, gone after [0-9.]+ s" % pid, out), out

    rc, out, recap = playbook(inventory, example)
    assert rc == 0 and recap[node.name]["changed"] == 0, out


@runs_examples("gpu_kill/preview_in_check_mode.yml")
def test_preview_in_check_mode(simnode, tmp_path, examples):
    [example] = examples
    node = simnode(gpus=2)
    holder = start_holder(node, [0, 1], mib=500, title="VLLM::Worker_TP0")
    rc, out, recap = playbook(example_inventory(tmp_path, node), example)
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert "would signal %d VLLM::Worker_TP0 (GPUs [0, 1])" % holder in out, out
    assert alive(node, holder) and [used for used, _pids in gpu_memory(node)] == [500, 500]


@runs_examples("gpu_wait/free_gpus_before_a_new_server.yml")
def test_free_gpus_before_a_new_server(simnode, tmp_path, examples):
    [example] = examples
    # The driver keeps a dead process's memory for 2.5 s more: gpu_wait has to wait for it.
    node = simnode(gpus=3, release_latency=2.5)
    holders = [start_holder(node, [0], mib=4000), start_holder(node, [1], mib=4000, mode="inherit")]
    untouched = start_holder(node, [2], mib=4000)
    rc, out, recap = playbook(example_inventory(tmp_path, node), example)
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    looks = int(re.search(r"GPUs 0 and 1 released after [0-9.]+ s \((\d+) looks\)", out).group(1))
    assert looks > 1, out
    assert gpu_memory(node)[:2] == [(0, []), (0, [])]
    assert not any(alive(node, pid) for pid in holders) and alive(node, untouched)


@runs_examples("reset_gpus/reset_vllm_gpus.yml")
def test_reset_vllm_gpus(simnode, tmp_path, examples):
    [example] = examples
    node = simnode(gpus=8, release_latency=0.3)
    engine, workers = orphan_vllm(node, [4, 5, 6, 7])
    other_server = start_holder(node, [0], mib=2000, title="vllm serve /models/other")
    inventory = example_inventory(tmp_path, node)

    rc, out, recap = playbook(inventory, example)
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert_ended(node, engine, workers)
    assert alive(node, other_server)
    memory = gpu_memory(node)
    assert memory[0][0] == 2000 and all(memory[gpu] == (0, []) for gpu in (4, 5, 6, 7)), memory

    rc, out, recap = playbook(inventory, example)
    assert rc == 0 and recap[node.name]["changed"] == 0, out


@runs_examples("vllm_speculative_config/check_dflash_drafter.yml")
def test_check_dflash_drafter(simnode, tmp_path, examples):
    [example] = examples
    inventory = example_inventory(tmp_path, simnode(gpus=1))
    drafter = '{"drafter": "%s"}' % (DRAFTERS / "dflash-qwen3")
    rc, out, recap = playbook(inventory, example, "-e", drafter)
    assert rc == 0 and recap and all(counts["changed"] == 0 for counts in recap.values()), out
    assert '\\"num_speculative_tokens\\":15' in out and "VLLM_USE_V2_MODEL_RUNNER" in out, out

    # The same play with the layers vLLM taps (target_layer_ids + 1) given instead fails, naming the field.
    wrong = example.read_text().replace("[1, 16, 31, 46, 61]", "[2, 17, 32, 47, 62]")
    assert wrong != example.read_text()
    wrong_example = tmp_path / example.name
    wrong_example.write_text(wrong)
    rc, out, recap = playbook(inventory, wrong_example, "-e", drafter)
    assert rc != 0 and "target_layer_ids" in out, out


@runs_examples(
    "detached_process/start_vllm.yml",
    "vllm_ready/wait_until_serving.yml",
    "vllm_acceptance/gate_on_acceptance.yml",
    "detached_process/stop_vllm.yml",
)
def test_serve_vllm_detached_wait_gate_and_stop(simnode, tmp_path, examples):
    start, ready, acceptance, stop = examples
    node = simnode(gpus=3, release_latency=0.2)
    inventory = example_inventory(tmp_path, node)
    port = free_port()
    variables = [
        "-e",
        json.dumps(
            {
                "vllm": str(node.state_dir / "bin" / "vllm"),
                "drafter": str(DRAFTERS / "dflash-qwen3"),
                "vllm_port": port,
                "state_dir": str(tmp_path),
                "log_dir": str(tmp_path),
            }
        ),
    ]

    rc, out, recap = playbook(inventory, start, *variables)
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    pid = int(re.search(r"vllm serve runs as PID (\d+)", out).group(1))
    assert alive(node, pid) and (tmp_path / "qwen.pid").is_file()
    rc, out, recap = playbook(inventory, start, *variables)
    assert rc == 0 and recap[node.name]["changed"] == 0 and "vllm serve runs as PID %d" % pid in out, out

    rc, out, recap = playbook(inventory, ready, *variables)
    assert rc == 0 and re.search(r"healthy after [0-9.]+ s, ready after [0-9.]+ s", out), out
    engine, workers = vllm_tree(node)
    assert len(engine) == 1 and len(workers) == 2
    assert [len(pids) for _used, pids in gpu_memory(node)] == [1, 1, 0]  # GPUs 0-1, one TP rank each

    rc, out, recap = playbook(inventory, acceptance, *variables)
    assert rc == 0, out
    rate = float(re.search(r"acceptance ([0-9.]+), [0-9.]+ tokens per target step", out).group(1))
    assert 0.6 <= rate <= 0.8, out  # the simulated drafter, run as trained (VLLM_USE_V2_MODEL_RUNNER=1 given)

    rc, out, recap = playbook(inventory, stop, *variables)
    assert rc == 0 and recap[node.name]["changed"] == 1, out
    assert not any(alive(node, process) for process in [pid] + engine + workers)
    assert not (tmp_path / "qwen.pid").exists()
    wait_for(lambda: gpu_memory(node) == [(0, [])] * 3, 10, what="the GPUs released")
