"""check_gpus.yml run on the GPU host itself (-i localhost, -c local), as docs/schedulers.md runs it.

Inside a simulated node, as a Slurm epilog or an init container runs it: it fails with its one line while a GPU is
held (a holder with memory behind it) and passes once the GPU is free; the Slurm script of docs/schedulers.md,
run from that page's text with a stand-in scontrol that records its arguments, drains the node with the line as
the reason and resumes it when a later check passes, and leaves a drain it did not set alone.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from ansible_run import REPO, VENV_BIN
from nodetools import alive, gpu_memory, start_holder

DOC = REPO / "docs" / "schedulers.md"
# The stand-in scontrol: records each call's arguments as a JSON line; `show node` prints the node's state and
# Reason as scontrol show node does; `update ... state=drain reason=R` and `state=resume` change that state.
SCONTROL = r"""#!/usr/bin/python3
import json, os, sys
calls, state = os.environ["SCONTROL_CALLS"], os.environ["SCONTROL_STATE"]
with open(calls, "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\n")
reason = open(state).read() if os.path.exists(state) else ""
if sys.argv[1:3] == ["show", "node"]:
    print("NodeName=%s Arch=x86_64 CoresPerSocket=32" % sys.argv[3])
    print("   State=%s ThreadsPerCore=2" % ("IDLE+DRAIN" if reason else "IDLE"))
    if reason:
        print("   Reason=%s [root@2026-12-01T20:00:00]" % reason)
elif sys.argv[1] == "update":
    fields = dict(argument.split("=", 1) for argument in sys.argv[2:])
    if fields.get("state") == "drain":
        open(state, "w").write(fields["reason"])
    elif fields.get("state") == "resume" and os.path.exists(state):
        os.remove(state)
"""


def epilog_text() -> str:
    """The script of docs/schedulers.md: the sh block after its <!-- gpuops-gpu-check.sh --> marker."""
    match = re.search(r"<!-- gpuops-gpu-check\.sh -->\n```sh\n(.*?)```", DOC.read_text(), re.S)
    assert match, "docs/schedulers.md has no script after <!-- gpuops-gpu-check.sh -->"
    return match.group(1)


def environment(node):
    """What a GPU host set up as docs/schedulers.md says has: ansible-playbook, the collection, a Python for the
    modules (the repository's .venv here: the node has no /opt/gpuops-nvidia/venv)."""
    return {
        "PATH": "%s:%s/bin:/usr/bin:/bin" % (VENV_BIN, node.state_dir),
        "ANSIBLE_PYTHON_INTERPRETER": str(VENV_BIN / "python"),
        "HOME": "/root",
    }


def local_check(node):
    """check_gpus.yml with -i localhost, -c local inside the node, from /; (rc, output, seconds)."""
    variables = dict(
        environment(node), ANSIBLE_COLLECTIONS_PATH=str(REPO / ".collections"), ANSIBLE_CALLBACK_FORMAT_PRETTY="false"
    )
    started = time.monotonic()
    result = node.exec(
        "env",
        "-C",
        "/",
        *("%s=%s" % item for item in variables.items()),
        "timeout",
        "120",
        str(VENV_BIN / "ansible-playbook"),
        "-i",
        "localhost,",
        "-c",
        "local",
        "gpuops.nvidia.check_gpus",
        check=False,
        timeout=150,
    )
    return result.returncode, result.stdout + result.stderr, time.monotonic() - started


def line_of(output: str) -> str:
    lines = re.findall(r'check_gpus localhost: [^"]*', output)
    assert lines, output
    return lines[0]


def test_local_check_fails_with_its_line_on_a_held_gpu_and_passes_on_a_free_one(simnode):
    node = simnode(gpus=2, release_latency=0.5)
    holder = start_holder(node, [1], mib=4000)
    rc, out, _seconds = local_check(node)
    assert rc == 2, out
    assert line_of(out).startswith("check_gpus localhost: not free: GPU 1: 4000 MiB used, held by PID %d" % holder), out
    assert "check_gpus summary: 1 host(s): 1 not free (localhost)" in out, out

    node.exec("kill", str(holder))
    while alive(node, holder) or gpu_memory(node)[1][0] > 256:
        time.sleep(0.2)
    rc, out, _seconds = local_check(node)
    assert rc == 0, out
    assert line_of(out) == "check_gpus localhost: GPUs free (2 checked): no holder, used memory at most 256 MiB each", (
        out
    )


def test_local_check_ends_within_its_bound_when_the_driver_hangs(simnode):
    node = simnode(gpus=2, hang="all")
    rc, out, seconds = local_check(node)
    assert rc == 2 and line_of(out).startswith(
        "check_gpus localhost: not checked: NVML did not answer within driver_timeout"
    ), out
    # docs/schedulers.md: check_gpus_driver_timeout (10 s) + check_gpus_wait (5 s) + 1 s + Ansible's start-up.
    assert seconds < 30, (seconds, out)


@pytest.fixture
def epilog(simnode, tmp_path):
    """(node, run) where run() runs the script of docs/schedulers.md in the node and returns the scontrol calls it made."""
    node = simnode(gpus=2, release_latency=0.5)
    script, scontrol = tmp_path / "gpuops-gpu-check.sh", tmp_path / "bin" / "scontrol"
    script.write_text(epilog_text())
    script.chmod(0o755)
    scontrol.parent.mkdir()
    scontrol.write_text(SCONTROL)
    scontrol.chmod(0o755)
    calls, state = tmp_path / "scontrol-calls", tmp_path / "scontrol-state"

    def run():
        calls.write_text("")
        variables = dict(
            environment(node),
            SLURMD_NODENAME="gpu07",
            SCONTROL=str(scontrol),
            SCONTROL_CALLS=str(calls),
            SCONTROL_STATE=str(state),
            GPUOPS_ANSIBLE_PLAYBOOK=str(VENV_BIN / "ansible-playbook"),
            GPUOPS_COLLECTIONS=str(REPO / ".collections"),
        )
        result = node.exec(
            "env", "-C", "/", *("%s=%s" % item for item in variables.items()), str(script), check=False, timeout=150
        )
        assert result.returncode == 0, result.stdout + result.stderr  # the script always exits 0
        return [json.loads(line) for line in calls.read_text().splitlines()]

    run.state = state
    return node, run


def test_epilog_drains_with_the_line_and_resumes_when_a_later_check_passes(epilog):
    node, run = epilog
    assert run() == [["show", "node", "gpu07"]]  # free and not drained: nothing to change

    holder = start_holder(node, [1], mib=4000)
    [drain] = run()
    assert drain[:3] == ["update", "nodename=gpu07", "state=drain"], drain
    assert drain[3].startswith("reason=gpuops: not free: GPU 1: 4000 MiB used, held by PID %d" % holder), drain
    assert run.state.read_text() == drain[3][len("reason=") :]

    node.exec("kill", str(holder))
    while alive(node, holder) or gpu_memory(node)[1][0] > 256:
        time.sleep(0.2)
    assert run() == [["show", "node", "gpu07"], ["update", "nodename=gpu07", "state=resume"]]
    assert not run.state.exists()


def test_epilog_leaves_a_drain_it_did_not_set_and_names_a_hung_driver(epilog):
    node, run = epilog
    run.state.write_text("memory DIMM B2 (admin)")
    assert run() == [["show", "node", "gpu07"]]
    assert run.state.read_text() == "memory DIMM B2 (admin)"

    run.state.unlink()
    node.set(hang="all")
    [drain] = run()
    assert drain[3].startswith("reason=gpuops: not checked: NVML did not answer within driver_timeout (10.0 s)"), drain
