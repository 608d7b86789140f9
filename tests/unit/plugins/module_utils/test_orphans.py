"""Which holders are orphaned (_orphans), on fake /proc trees: each reason, and what is never called orphaned."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _orphans


def fake_proc(tmp_path, processes):
    """A /proc with {pid: (comm, ppid, argv, nspids)} (stat, cmdline, status)."""
    root = tmp_path / "proc"
    for pid, (comm, ppid, argv, nspids) in processes.items():
        directory = root / str(pid)
        directory.mkdir(parents=True)
        fields = ["S", str(ppid), str(pid), str(pid)] + ["0"] * 15 + [str(1000 + pid)] + ["0"] * 20
        (directory / "stat").write_text("%d (%s) %s\n" % (pid, comm, " ".join(fields)))
        (directory / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in argv) + b"\0")
        (directory / "status").write_text("Name:\t%s\nNSpid:\t%s\n" % (comm, "\t".join(str(p) for p in nspids)))
    return str(root)


def holder(pid, ppid, comm, owner=None, contexts_of=None):
    return {
        "pid": pid,
        "ppid": ppid,
        "comm": comm,
        "start_ticks": 1000 + pid,
        "gpus": [0],
        "memory_mib": {"0": 1000},
        "owner": dict({"agent": None}, **(owner or {})),
        "contexts_of": contexts_of or {},
    }


VLLM_AGENT = {"agent": {"pid": 5, "comm": "vllm", "cmdline": "vllm serve m", "kind": "vllm"}}


def test_vllm_tree_under_init_is_orphaned_and_under_its_server_is_not(tmp_path):
    proc = fake_proc(
        tmp_path,
        {
            1: ("init", 0, ["init"], [1]),
            5: ("vllm", 1, ["/venv/bin/python", "/venv/bin/vllm", "serve", "m"], [5]),
            6: ("VLLM::EngineCor", 5, ["VLLM::EngineCore"], [6]),
            7: ("VLLM::Worker_TP", 6, ["VLLM::Worker_TP0"], [7]),
            8: ("VLLM::EngineCor", 1, ["VLLM::EngineCore"], [8]),
            9: ("VLLM::Worker_TP", 8, ["VLLM::Worker_TP0"], [9]),
        },
    )
    judge = _orphans.Judge(proc=proc, run=lambda argv: None)
    assert judge.reason(holder(7, 6, "VLLM::Worker_TP", VLLM_AGENT)) is None
    assert judge.reason(holder(9, 8, "VLLM::Worker_TP")) == "vllm_server_exited"
    # TP=1: EngineCore is the holder itself.
    assert judge.reason(holder(8, 1, "VLLM::EngineCor")) == "vllm_server_exited"


def test_vllm_tree_under_a_container_init_is_orphaned_under_another_parent_is_not(tmp_path):
    proc = fake_proc(
        tmp_path,
        {
            40: ("tini", 30, ["tini"], [40, 1]),
            41: ("VLLM::EngineCor", 40, ["VLLM::EngineCore"], [41, 2]),
            50: ("python3", 1, ["python3", "-m", "vllm.entrypoints.openai.api_server"], [50]),
            51: ("VLLM::EngineCor", 50, ["VLLM::EngineCore"], [51]),
        },
    )
    judge = _orphans.Judge(proc=proc, run=lambda argv: None)
    assert judge.reason(holder(41, 40, "VLLM::EngineCor")) == "vllm_server_exited"
    # A live parent that is not `vllm serve` (another launcher): nothing says the server is gone.
    assert judge.reason(holder(51, 50, "VLLM::EngineCor")) is None


def test_not_vllm_and_unreadable_parents_are_not_orphaned(tmp_path):
    proc = fake_proc(tmp_path, {1: ("init", 0, ["init"], [1]), 3: ("python3", 1, ["python3", "train.py"], [3])})
    judge = _orphans.Judge(proc=proc, run=lambda argv: None)
    assert judge.reason(holder(3, 1, "python3")) is None
    assert judge.reason(holder(4, 99, "VLLM::Worker_TP")) is None  # parent gone from /proc: not decided


@pytest.mark.parametrize(
    "state, expected", [("inactive", "unit_inactive"), ("failed", "unit_inactive"), ("active", None)]
)
def test_unit_state(tmp_path, state, expected):
    proc = fake_proc(tmp_path, {1: ("init", 0, ["init"], [1]), 3: ("python3", 1, ["python3"], [3])})
    asked = []

    def run(argv):
        asked.append(argv)
        return 0, state + "\n"

    judge = _orphans.Judge(proc=proc, run=run)
    owner = {"systemd_unit": "train.service"}
    assert judge.reason(holder(3, 1, "python3", owner)) == expected
    assert judge.reason(holder(3, 1, "python3", owner)) == expected
    assert asked == [["systemctl", "show", "-p", "ActiveState", "--value", "--", "train.service"]]  # once per unit


def test_unit_state_unknown_or_scope_is_not_orphaned(tmp_path):
    proc = fake_proc(tmp_path, {1: ("init", 0, ["init"], [1]), 3: ("python3", 1, ["python3"], [3])})
    judge = _orphans.Judge(proc=proc, run=lambda argv: None)
    assert judge.reason(holder(3, 1, "python3", {"systemd_unit": "train.service"})) is None
    judge = _orphans.Judge(proc=proc, run=lambda argv: (0, "inactive\n"))
    assert judge.reason(holder(3, 1, "python3", {"systemd_unit": "session-3.scope"})) is None


def test_slurm_job_ended_only_in_the_initial_namespace(tmp_path):
    proc = fake_proc(
        tmp_path,
        {
            1: ("init", 0, ["init"], [1]),
            2: ("slurmstepd", 1, ["slurmstepd: [42.0]"], [2]),
            3: ("python3", 1, ["python3"], [3]),
        },
    )
    host = _orphans.Judge(proc=proc, initial_pidns=True, run=lambda argv: None)
    assert host.reason(holder(3, 1, "python3", {"slurm_job": "42"})) is None
    assert host.reason(holder(3, 1, "python3", {"slurm_job": "43"})) == "slurm_job_ended"
    container = _orphans.Judge(proc=proc, initial_pidns=False, run=lambda argv: None)
    assert container.reason(holder(3, 1, "python3", {"slurm_job": "43"})) is None


def test_pod_gone_needs_the_kubelet_directory(tmp_path):
    proc = fake_proc(tmp_path, {1: ("init", 0, ["init"], [1]), 3: ("python3", 1, ["python3"], [3])})
    pods = tmp_path / "pods"
    owner = {"pod_uid": "0a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d"}
    judge = _orphans.Judge(proc=proc, run=lambda argv: None, kubelet_pods=str(pods))
    assert judge.reason(holder(3, 1, "python3", owner)) is None  # no kubelet here: not decided
    (pods / owner["pod_uid"]).mkdir(parents=True)
    assert judge.reason(holder(3, 1, "python3", owner)) is None
    (pods / owner["pod_uid"]).rmdir()
    assert judge.reason(holder(3, 1, "python3", owner)) == "pod_gone"


def test_exited_creator_and_orphans_list(tmp_path):
    proc = fake_proc(tmp_path, {1: ("init", 0, ["init"], [1]), 3: ("python3", 1, ["python3"], [3])})
    judge = _orphans.Judge(proc=proc, run=lambda argv: None)
    child = holder(3, 1, "python3", {"systemd_unit": "x.service"}, contexts_of={"0": [2]})
    child["memory_mib"] = {"0": None}
    judge = _orphans.Judge(proc=proc, run=lambda argv: (0, "active\n"))
    assert _orphans.orphans({"holders": [child, holder(9, 1, "python3")]}, judge) == [
        {
            "pid": 3,
            "start_ticks": 1003,
            "comm": "python3",
            "reason": "exited_creator",
            "owner_label": "unit:x.service",
            "gpus": [0],
            "memory_mib": {"0": None},
        }
    ]
