"""Which holders are orphaned (_orphans), on fake /proc trees: each reason, and what is never called orphaned."""

from __future__ import annotations

import pytest

from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _orphans


def fake_proc(tmp_path, processes, pipes=None, state=None):
    """A /proc with {pid: (comm, ppid, argv, nspids)} (stat, cmdline, status) and, for the PIDs in `pipes`
    ({pid: [(fd, pipe inode, "r" or "w")]}), the fds as the kernel shows them: a `pipe:[INODE]` link and fdinfo
    flags (O_RDONLY or O_WRONLY, with O_CLOEXEC). `state`: {pid: state letter} (default S)."""
    root = tmp_path / "proc"
    for pid, (comm, ppid, argv, nspids) in processes.items():
        directory = root / str(pid)
        directory.mkdir(parents=True)
        fields = [(state or {}).get(pid, "S"), str(ppid), str(pid), str(pid)] + ["0"] * 15 + [str(1000 + pid)]
        (directory / "stat").write_text("%d (%s) %s\n" % (pid, comm, " ".join(fields + ["0"] * 20)))
        (directory / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in argv) + b"\0")
        (directory / "status").write_text("Name:\t%s\nNSpid:\t%s\n" % (comm, "\t".join(str(p) for p in nspids)))
    for pid, ends in (pipes or {}).items():
        (root / str(pid) / "fd").mkdir()
        (root / str(pid) / "fdinfo").mkdir()
        for fd, inode, mode in ends:
            (root / str(pid) / "fd" / str(fd)).symlink_to("pipe:[%d]" % inode)
            flags = "02000000" if mode == "r" else "02000001"
            (root / str(pid) / "fdinfo" / str(fd)).write_text("pos:\t0\nflags:\t%s\nmnt_id:\t15\n" % flags)
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


def engine(ppid, *nspids):
    return ("VLLM::EngineCor", ppid, ["VLLM::EngineCore"], list(nspids))


def worker(ppid, *nspids):
    return ("VLLM::Worker_TP", ppid, ["VLLM::Worker_TP0"], list(nspids))


def started(parent, child, inode):
    """The pipes multiprocessing leaves between `parent` and the `child` it started: the parent reads the sentinel
    (inode), the child writes it; the child reads its parent sentinel (inode + 1), the parent writes it. Each
    process also has its stdio on fds 0-2."""
    return {parent: [(7, inode, "r"), (8, inode + 1, "w")], child: [(5, inode, "w"), (6, inode + 1, "r")]}


def merged(*tables):
    out = {}
    for table in tables:
        for pid, ends in table.items():
            out.setdefault(pid, []).extend(ends)
    return out


def test_a_live_server_is_its_engines_server_whatever_its_command_line_and_place(tmp_path):
    # 40: an API server that is the init of its container's PID namespace, started as `python -m ...`;
    # 50: a launcher that is not `vllm serve` (a script using vLLM), under the host's init; 60: `vllm serve` as
    # PID 1 of a nested namespace (its NSpid ends in 1), with a TP=2 tree.
    proc = fake_proc(
        tmp_path,
        {
            1: ("init", 0, ["init"], [1]),
            40: ("python3", 30, ["python3", "-m", "vllm.entrypoints.openai.api_server"], [40, 1]),
            41: engine(40, 41, 2),
            50: ("python3", 1, ["python3", "serve_llm.py"], [50]),
            51: engine(50, 51),
            60: ("vllm", 30, ["/venv/bin/python", "/venv/bin/vllm", "serve", "m"], [60, 1, 1]),
            61: engine(60, 61, 2, 2),
            62: worker(61, 62, 3, 3),
        },
        pipes=merged(started(40, 41, 100), started(50, 51, 200), started(60, 61, 300), started(61, 62, 400)),
    )
    judge = _orphans.Judge(proc=proc, run=lambda argv: None)
    assert judge.reason(holder(41, 40, "VLLM::EngineCor")) is None
    assert judge.reason(holder(51, 50, "VLLM::EngineCor")) is None
    assert judge.reason(holder(62, 61, "VLLM::Worker_TP")) is None


def test_an_engine_handed_to_an_init_or_a_subreaper_is_orphaned(tmp_path):
    # The servers are gone: 8 was handed to the host's init, 41 to its container's init (tini), 71 to a subreaper
    # (systemd --user); 9 and 72 are their workers. 81 is a worker whose EngineCore died, handed to the init.
    proc = fake_proc(
        tmp_path,
        {
            1: ("init", 0, ["init"], [1]),
            8: engine(1, 8),
            9: worker(8, 9),
            40: ("tini", 30, ["tini", "--", "python3", "serve.py"], [40, 1]),
            41: engine(40, 41, 2),
            70: ("systemd", 1, ["/usr/lib/systemd/systemd", "--user"], [70]),
            71: engine(70, 71),
            72: worker(71, 72),
            81: worker(1, 81),
        },
        # What each still holds of its dead starter's pipes; the init and tini hold the engine's stdout (fd 1 of
        # the engine, inherited from the server), which is no sentinel.
        pipes=merged(
            {8: [(5, 100, "w"), (6, 101, "r")], 41: [(1, 150, "w"), (5, 200, "w")], 40: [(1, 150, "w")]},
            {71: [(5, 300, "w")], 81: [(5, 500, "w")], 70: [(3, 900, "r")], 1: [(0, 150, "r")]},
            started(8, 9, 110),
            started(71, 72, 310),
        ),
    )
    judge = _orphans.Judge(proc=proc, run=lambda argv: None)
    assert judge.reason(holder(8, 1, "VLLM::EngineCor")) == "vllm_server_exited"  # TP=1: EngineCore holds
    assert judge.reason(holder(9, 8, "VLLM::Worker_TP")) == "vllm_server_exited"
    assert judge.reason(holder(41, 40, "VLLM::EngineCor")) == "vllm_server_exited"
    assert judge.reason(holder(72, 71, "VLLM::Worker_TP")) == "vllm_server_exited"
    assert judge.reason(holder(81, 1, "VLLM::Worker_TP")) == "vllm_server_exited"


def test_what_cannot_be_read_is_not_orphaned(tmp_path):
    proc = fake_proc(
        tmp_path,
        {
            1: ("init", 0, ["init"], [1]),
            3: ("python3", 1, ["python3", "train.py"], [3]),
            5: engine(1, 5),  # its fds cannot be read (no fd directory: another user's, or gone)
            20: ("python3", 1, ["python3", "serve.py"], [20]),  # a leader whose main thread exited, threads live
            21: engine(20, 21),
            30: ("tini", 1, ["tini"], [30]),
            31: engine(30, 31),  # holds no pipe's write end: no evidence either way
        },
        pipes={1: [], 20: [], 21: [(5, 100, "w")], 30: [], 31: [(1, 150, "w"), (5, 160, "r")]},
        state={20: "Z"},
    )
    judge = _orphans.Judge(proc=proc, run=lambda argv: None)
    assert judge.reason(holder(3, 1, "python3")) is None
    assert judge.reason(holder(4, 99, "VLLM::Worker_TP")) is None  # parent gone from /proc: not decided
    assert judge.reason(holder(5, 1, "VLLM::EngineCor")) is None
    assert judge.reason(holder(21, 20, "VLLM::EngineCor")) is None
    assert judge.reason(holder(31, 30, "VLLM::EngineCor")) is None


def shows(load, active):
    """systemctl show as systemd answers it: the asked properties in systemd's order (not -p's), exit 0."""

    def run(argv):
        asked = ",".join(argv[i + 1] for i, arg in enumerate(argv) if arg == "-p").split(",")
        lines = [(name, value) for name, value in (("LoadState", load), ("ActiveState", active)) if name in asked]
        return 0, "".join((value if "--value" in argv else "%s=%s" % (name, value)) + "\n" for name, value in lines)

    return run


@pytest.mark.parametrize(
    "state, expected", [("inactive", "unit_inactive"), ("failed", "unit_inactive"), ("active", None)]
)
def test_unit_state(tmp_path, state, expected):
    proc = fake_proc(tmp_path, {1: ("init", 0, ["init"], [1]), 3: ("python3", 1, ["python3"], [3])})
    asked = []

    def run(argv):
        asked.append(argv)
        return shows("loaded", state)(argv)

    judge = _orphans.Judge(proc=proc, run=run)
    owner = {"systemd_unit": "train.service"}
    assert judge.reason(holder(3, 1, "python3", owner)) == expected
    assert judge.reason(holder(3, 1, "python3", owner)) == expected
    assert asked == [["systemctl", "show", "-p", "LoadState,ActiveState", "--", "train.service"]]  # once per unit


def test_unit_state_unknown_or_scope_is_not_orphaned(tmp_path):
    proc = fake_proc(tmp_path, {1: ("init", 0, ["init"], [1]), 3: ("python3", 1, ["python3"], [3])})
    judge = _orphans.Judge(proc=proc, run=lambda argv: None)
    assert judge.reason(holder(3, 1, "python3", {"systemd_unit": "train.service"})) is None
    judge = _orphans.Judge(proc=proc, run=shows("loaded", "inactive"))
    assert judge.reason(holder(3, 1, "python3", {"systemd_unit": "session-3.scope"})) is None
    # A unit the system manager does not know: systemd answers `inactive` with exit 0 (systemd#1105).
    judge = _orphans.Judge(proc=proc, run=shows("not-found", "inactive"))
    assert judge.reason(holder(3, 1, "python3", {"systemd_unit": "llm.service"})) is None


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
    judge = _orphans.Judge(proc=proc, run=shows("loaded", "active"))
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
