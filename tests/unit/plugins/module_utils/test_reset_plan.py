"""_reset_plan on data: which GPUs a reset is for, every precondition refused by name, the steps and their undo."""

from __future__ import annotations

import copy

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _reset_plan as plan

HOST = {"root": True, "container": None, "initial_pid_namespace": True, "own_pid_namespace": False,
        "nvidia_smi": "/usr/bin/nvidia-smi"}  # fmt: skip


def gpu(index, unexplained=0, holders=(), needs=None, why=(), peers=(), persistence=True, error=None, mig=()):
    return {
        "index": index,
        "uuid": "GPU-%d" % index,
        "pci_bus_id": "00000000:%02X:00.0" % (0x18 + index),
        "memory_used_mib": unexplained,
        "unexplained_mib": unexplained,
        "memory_unexplained": unexplained > 256,
        "holder_pids": list(holders),
        "error": error,
        "mig_devices": list(mig),
        "recovery": {"needs": needs, "why": list(why), "reset_peers": list(peers), "persistence_mode": persistence},
    }


def view(*gpus, users=()):
    return {"gpus": list(gpus), "device_users": list(users)}


def user(pid, gpus, comm="nvidia-persiste", owner=None):
    return {"pid": pid, "comm": comm, "device_gpus": list(gpus), "owner": owner or {}}


def test_a_reset_is_for_leaked_memory_on_an_unheld_gpu_or_the_drivers_advice_only():
    seen = view(
        gpu(0, unexplained=4000),
        gpu(1, unexplained=4000, holders=[7]),
        gpu(2, needs="reset", why=["the driver's recovery action is gpu_reset"]),
        gpu(3, unexplained=100),
    )
    assert plan.candidates(seen, None) == {
        0: "4000 MiB used that no process explains",
        2: "the driver's recovery action is gpu_reset",
    }
    assert plan.candidates(seen, [1, 3]) == {}


def test_nvlink_peers_join_the_reset_and_theirs_too():
    seen = view(gpu(0, peers=[1]), gpu(1, peers=[0, 2]), gpu(2, peers=[1]), gpu(3))
    assert plan.with_peers(seen, [0]) == [0, 1, 2] and plan.with_peers(seen, [3]) == [3]


@pytest.mark.parametrize(
    "change, name, words",
    [
        ({"root": False}, "root", "root"),
        ({"container": "pod 1234"}, "host", "runs in pod 1234"),
        ({"initial_pid_namespace": False}, "host", "not the host's (initial) one"),
        ({"nvidia_smi": None}, "nvidia_smi", "not on PATH"),
    ],
)
def test_each_host_precondition_is_refused_by_name(change, name, words):
    checks = plan.host_checks(dict(HOST, **change))
    refused = [check for check in checks if not check["ok"]]
    assert [check["name"] for check in refused] == [name] and words in refused[0]["why"]
    assert name in plan.refusal(checks) and words in plan.refusal(checks)


def test_a_pid_namespace_said_to_be_the_machines_own_passes():
    assert plan.refusal(plan.host_checks(dict(HOST, initial_pid_namespace=False, own_pid_namespace=True))) is None


DAEMONS = {10: ("nvidia-persistenced", "nvidia-persistenced.service"), 11: ("nv-hostengine", None), 12: (None, None)}


@pytest.mark.parametrize(
    "seen, name, words",
    [
        (view(gpu(0, error="GPU is lost")), "driver", "a lost GPU needs a reboot"),
        (view(gpu(0, needs="reboot", why=["the driver's recovery action is node_reboot"])), "advice", "node_reboot"),
        (view(gpu(0, holders=[7, 8])), "holders", "GPU 0 is held by PID 7, 8"),
        (view(gpu(0), users=[user(12, [0], comm="python3")]), "device_users", "is no GPU daemon"),
        (
            view(
                gpu(0),
                users=[
                    user(
                        11,
                        [0],
                        comm="nv-hostengine",
                        owner={"pod_uid": "u", "pod_namespace": "gpu", "pod_name": "dcgm"},
                    )
                ],
            ),  # fmt: skip
            "device_users",
            "pod gpu/dcgm",
        ),
        (view(gpu(0, mig=[{"uuid": "MIG-1"}, {"uuid": "MIG-2"}])), "mig", "2 MIG instance(s)"),
    ],
)
def test_each_gpu_precondition_is_refused_by_name(seen, name, words):
    checks = plan.gpu_checks(seen, [0], DAEMONS)
    refused = [check for check in checks if not check["ok"]]
    assert [check["name"] for check in refused] == [name] and words in refused[0]["why"], refused
    assert refused[0]["gpus"] == [0]


def test_the_steps_stop_the_daemons_turn_persistence_off_reset_and_restore_in_reverse():
    seen = view(gpu(0, persistence=True), gpu(1, persistence=False), users=[user(10, [0, 1]), user(13, [3])])
    units = plan.units_to_stop(seen, [0, 1], DAEMONS)
    assert units == {"nvidia-persistenced.service": [10]}
    steps = plan.steps(seen, [0, 1], dict(units, **{"nvidia-dcgm.service": [14]}), "nvidia-smi", "systemctl")
    assert [(s["step"], s["command"][-1]) for s in steps] == [
        ("stop", "nvidia-persistenced.service"),
        ("stop", "nvidia-dcgm.service"),
        ("persistence_off", "GPU-0"),
        ("reset", "GPU-0,GPU-1"),
        ("persistence_on", "GPU-0"),
        ("start", "nvidia-dcgm.service"),
        ("start", "nvidia-persistenced.service"),
    ]
    assert steps[0]["undo"] == ["systemctl", "start", "nvidia-persistenced.service"]
    assert steps[2]["undo"] == ["nvidia-smi", "-pm", "1", "-i", "GPU-0"] and steps[3]["undo"] is None


def fake_steps():
    seen = view(gpu(0), users=[user(10, [0])])
    return plan.steps(seen, [0], plan.units_to_stop(seen, [0], DAEMONS), "nvidia-smi", "systemctl")


def test_a_failure_before_the_reset_undoes_what_was_done_newest_first():
    ran = []

    def run(step):
        ran.append(" ".join(step["command"]))
        return "In use by another client" if step["step"] == "reset" else None

    done, failed, undone = plan.run_steps(fake_steps(), run)
    assert [s["step"] for s in done] == ["stop", "persistence_off"] and failed[0]["step"] == "reset"
    assert [u["command"] for u, _error in undone] == [
        ["nvidia-smi", "-pm", "1", "-i", "GPU-0"],
        ["systemctl", "start", "nvidia-persistenced.service"],
    ]
    assert ran[-2:] == ["nvidia-smi -pm 1 -i GPU-0", "systemctl start nvidia-persistenced.service"]


def test_a_failure_after_the_reset_is_reported_and_the_restore_goes_on():
    def run(step):
        return "exit 1" if step["step"] == "persistence_on" else None

    done, failed, undone = plan.run_steps(fake_steps(), run)
    assert failed[0]["step"] == "persistence_on" and undone == []
    assert [s["step"] for s in done] == ["stop", "persistence_off", "reset", "start"]


@pytest.mark.parametrize(
    "code, output, cause, step",
    [
        (255, "GPU 00000000:18:00.0: In use by another client", "another client", "reboot the node"),
        (None, "", "did not return within 60 s", "reboot the node"),
        (4, "Insufficient Permissions", "permission", "as root"),
        (3, "", "does not support", "reboot"),
        (15, "", "lost", "reboot"),
        (255, "Unknown Error", "exit 255: Unknown Error", "reboot"),
    ],
)
def test_a_failed_reset_names_the_cause_and_the_next_step(code, output, cause, step):
    why, next_step = plan.failure_step(code, output, 60, "gpu07")
    assert cause in why and step in next_step
    if step.startswith("reboot"):
        assert 'scontrol update nodename=gpu07 state=drain reason="gpuops: GPU reset failed"' in next_step


def test_nothing_is_changed_in_the_plan_data():
    seen = view(gpu(0, unexplained=4000, peers=[1]), gpu(1, peers=[0]))
    kept = copy.deepcopy(seen)
    plan.steps(seen, plan.with_peers(seen, plan.candidates(seen, None)), {}, "nvidia-smi", "systemctl")
    assert seen == kept
