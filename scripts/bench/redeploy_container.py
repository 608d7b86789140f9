# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The redeploy of an instance in a podman container against a detached one, on one simulated node (issue 43).

    .venv/bin/python scripts/bench/redeploy_container.py [ROUNDS]     # default 4

Instance c (podman, GPU 0, tests/integration/containertools.py) and instance d (detached, GPU 1), both the simulated
vLLM with the corrected DFlash config and a 2 s model load. Each round is one play of playbooks/redeploy_vllm.yml that
changes both instances' gpu_memory_utilization; the figure per instance is the summary's "down X s in all" (from its
drain to its first healthy answer: drain, stop, free, start, load, health). Prints each round and the medians. Needs
root and podman (make setup). systemd units cannot run here, so the yardstick is the detached instance.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "tests"), str(REPO / "tests" / "integration")]

from containertools import RUN_OPTIONS, PodmanHost  # noqa: E402
from ports import free_ports  # noqa: E402
from simnode import inventory_file, up  # noqa: E402
from test_vllm_podman import CDI_SPEC, container_instance  # noqa: E402
from test_vllm_server import CORRECTED, instance, run, summary, write_host_vars  # noqa: E402


def downtimes(output: str, node) -> dict:
    """{instance: seconds} of the summary's "down X s in all" lines."""
    found, name = {}, None
    for line in summary(output, node):
        head = re.match(r"(\w+) \(GPUs", line)
        name = head.group(1) if head else name
        down = re.match(r"  healthy .* down ([\d.]+) s in all", line)
        if down and name:
            found[name] = float(down.group(1))
    return found


def main(rounds: int) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="redeploy-container-"))
    node = up("redeploy-container-%d" % time.time_ns(), gpus=2, release_latency=0.5)
    host = PodmanHost(node, workdir)
    try:
        node.exec("sh", "-c", "mkdir -p /run/cdi && cat > /run/cdi/nvidia.json", input=json.dumps(CDI_SPEC))
        host.build(entrypoint=(str(node.state_dir / "bin" / "vllm"), "serve"))
        port_c, port_d = free_ports(2)
        env = {"SIMVLLM_LOAD_SECONDS": "2.0"}
        contained = dict(
            container_instance(node, host, port_c), name="c", speculative_config=CORRECTED, environment=env
        )
        detached = instance("d", port_d, [1], CORRECTED, environment=env)
        write_host_vars(
            workdir,
            node,
            [contained, detached],
            vllm_server_container_options=RUN_OPTIONS,
            vllm_server_ready_poll_interval=0.2,
        )
        inventory = inventory_file(workdir, node)
        rc, output, _recap = run(inventory)
        if rc != 0:
            raise SystemExit("the first deployment failed:\n" + output[-3000:])
        figures = {"c": [], "d": []}
        for number in range(rounds):
            override = {"test_override": {"gpu_memory_utilization": 0.85 if number % 2 == 0 else 0.9}}
            rc, output, _recap = run(inventory, "-e", json.dumps(override))
            if rc != 0:
                raise SystemExit("round %d failed:\n%s" % (number + 1, output[-3000:]))
            for name, seconds in downtimes(output, node).items():
                figures[name].append(seconds)
            print("round %d: podman %s s, detached %s s" % (number + 1, figures["c"][-1], figures["d"][-1]), flush=True)
        podman, plain = statistics.median(figures["c"]), statistics.median(figures["d"])
        print("median down: podman %.2f s, detached %.2f s, ratio %.2f" % (podman, plain, podman / plain))
    finally:
        host.clean()
        node.down()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 4)
