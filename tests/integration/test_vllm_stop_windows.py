"""Stopping vLLM as vLLM 0.33 really stops: during model loading, and the role's stop against the shutdown window.

vLLM 0.33 defers a stop that arrives while EngineCore is being built (model loading) until loading ends
(vllm/v1/engine/core.py run_engine_core), and its workers, inside a long CUDA or NCCL call, run no Python signal
handler (multiproc_executor.py WorkerProc.worker_main): only SIGKILL ends them before loading is done. The
simulated vLLM models this with SIMVLLM_LOAD_SECONDS and SIMVLLM_WORKERS_IGNORE_SIGTERM.
"""

from __future__ import annotations

import json
import re
import time

from ansible_run import module, only
from nodetools import gpu_memory, processes
from polling import poll_until
from simnode import inventory_file
from test_vllm_drain import Load
from test_vllm_server import MODEL, free_ports, instance, run, summary, write_host_vars


def holders(node, gpus):
    memory = gpu_memory(node)
    return {index: memory[index][1] for index in gpus if memory[index][1]}


def test_a_stop_during_loading_frees_the_gpus_within_grace_period_plus_kill_wait(simnode, tmp_path):
    node = simnode(gpus=2, release_latency=0.2)
    port = free_ports(1)[0]
    inventory = inventory_file(tmp_path, node)
    pidfile, log = tmp_path / "loading.pid", tmp_path / "loading.log"
    # A load of 10 minutes; the API server's own start-up window (VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS) longer still,
    # so that only the module's SIGKILL can end the loading workers in time.
    status, result = only(
        module(
            inventory,
            "gpuops.nvidia.detached_process",
            {
                "state": "started",
                "pidfile": str(pidfile),
                "log_file": str(log),
                "argv": [
                    str(node.state_dir / "bin" / "vllm"),
                    "serve",
                    MODEL,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "-tp",
                    "2",
                ],
                "environment": {
                    "SIMVLLM_LOAD_SECONDS": "600",
                    "SIMVLLM_WORKERS_IGNORE_SIGTERM": "1",
                    "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS": "600",
                    "CUDA_VISIBLE_DEVICES": "0,1",
                },
            },
        )
    )
    assert status == "CHANGED", result
    deadline = time.monotonic() + 30
    while len(holders(node, [0, 1])) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert len(holders(node, [0, 1])) == 2, gpu_memory(node)
    time.sleep(1.0)  # loading has started: EngineCore defers any stop until it ends

    grace, kill_wait = 3.0, 5.0
    started = time.monotonic()
    status, result = only(
        module(
            inventory,
            "gpuops.nvidia.detached_process",
            {"state": "stopped", "pidfile": str(pidfile), "grace_period": grace, "kill_wait": kill_wait},
        )
    )
    elapsed = time.monotonic() - started
    assert status == "CHANGED", result
    assert not result["survived"], result
    workers = [entry for entry in result["signalled"] if "SIGKILL" in entry["signals"]]
    assert len(workers) >= 2, result  # the loading workers outlived SIGTERM: ended by SIGKILL after the grace period
    assert all(entry["exited_after_s"] >= grace for entry in workers), result
    # A SIGKILLed holder stays listed until the driver releases its memory (0.2 s here; 0.15 s on an H200,
    # tests/fixtures/hardware/README.md point 6).
    assert poll_until(lambda: not holders(node, [0, 1]), timeout=5), gpu_memory(node)
    assert elapsed < grace + kill_wait + 10, elapsed  # not the 600 s load
    assert not [pid for pid, entry in processes(node).items() if "VLLM::" in entry[3] and entry[1] != "Z"]


def test_the_role_stop_follows_the_shutdown_window(simnode, tmp_path):
    """The drain's SIGTERM of the API server: with shutdown_timeout 4 the running requests get 4 s more and the
    server exits about 4 s later; with 0 (vLLM's default) vLLM aborts them and kills its own tree at once."""
    node = simnode(gpus=1, release_latency=0.2)
    port = free_ports(1)[0]
    inventory = inventory_file(tmp_path, node)
    slow = {"SIMVLLM_LOAD_SECONDS": "0.3", "SIMVLLM_TOKEN_SECONDS": "0.1"}  # a 100-token request takes 10 s
    write_host_vars(
        tmp_path,
        node,
        [instance("a", port, [0], environment=slow, shutdown_timeout=4)],
        vllm_server_drain_poll_interval=0.2,
        vllm_server_warmup_max_tokens=8,
        vllm_server_drain_timeout=0,
    )
    rc, out, _recap = run(inventory)
    assert rc == 0, out
    routed = tmp_path / "routed"
    exits = []
    # each run stops the server the run before started: with 4, with 4, then with 0
    for override in (
        {"gpu_memory_utilization": 0.85},
        {"gpu_memory_utilization": 0.8, "shutdown_timeout": 0},
        {"gpu_memory_utilization": 0.75, "shutdown_timeout": 0},
    ):
        routed.touch()
        load = Load(port, "qwen-a", routed, clients=2)
        try:
            load.wait_sending()
            rc, out, _recap = run(inventory, "-e", json.dumps({"test_override": override}))
        finally:
            results = load.finish()
        assert rc == 0, out
        lines = "\n".join(summary(out, node))
        match = re.search(r"server exited ([\d.]+) s after SIGTERM", lines)
        assert match, lines
        exits.append(float(match.group(1)))
        assert [r for r in results if r[2] == "abort"], results  # no drain time: what ran longer was aborted
    assert 4.0 <= exits[0] < 7.0 and 4.0 <= exits[1] < 7.0, exits
    assert exits[2] < 2.0, exits
