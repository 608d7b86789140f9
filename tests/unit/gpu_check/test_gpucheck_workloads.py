"""tests/gpu/gpucheck/workloads.py and tests/gpu/workload.py without a GPU: the simulator's context files stand in
for CUDA (tests/sim/README.md, "Creating a CUDA context"), outside any node (GPUSIM_RUN and dev_dir point at tmp)."""

import os
import signal

import pytest

from gpucheck import procs
from gpucheck.timing import poll_until
from gpucheck.workloads import PidUnavailable, WorkloadError, Workloads, claim_pid

MIB = 1 << 20


@pytest.fixture
def sim_run(tmp_path, monkeypatch):
    """A run directory and device directory as a simulated node has them; returns (workloads run dir, sim run dir)."""
    sim_dir, dev_dir, run_dir = tmp_path / "sim", tmp_path / "dev", tmp_path / "run"
    for directory in (sim_dir / "contexts", dev_dir, run_dir):
        directory.mkdir(parents=True)
    for name in ("nvidiactl", "nvidia-uvm", "nvidia4"):
        (dev_dir / name).write_bytes(b"")
    (sim_dir / "node.conf").write_text("gpus=1\nminors=4\ndev_dir=%s\n" % dev_dir)
    monkeypatch.setenv("GPUSIM_RUN", str(sim_dir))
    return run_dir, sim_dir


@pytest.fixture
def make_workloads():
    made = []

    def make(run_dir, backend="sim"):
        workloads = Workloads(str(run_dir), "gpucheck-test-%d" % os.getpid(), backend, 0, "GPU-test", max_lifetime=120)
        made.append(workloads)
        return workloads

    yield make
    for workloads in made:
        assert workloads.stop_all() == []


def open_device_files(pid, dev_dir):
    """Paths under dev_dir that `pid` holds open (workload.py reports /dev/nvidia* only)."""
    fd_dir = "/proc/%d/fd" % pid
    return sorted(
        {os.readlink(os.path.join(fd_dir, fd)) for fd in os.listdir(fd_dir)}
        & {os.path.join(dev_dir, name) for name in os.listdir(dev_dir)}
    )


def mappings(pid, dev_dir):
    """[(perms, KiB, offset, name)] of `pid`'s mappings of files under dev_dir, sorted."""
    found = []
    with open("/proc/%d/maps" % pid) as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].strip().startswith(str(dev_dir) + "/"):
                start, end = (int(part, 16) for part in fields[0].split("-"))
                found.append((fields[1], (end - start) >> 10, int(fields[2], 16), os.path.basename(fields[5].strip())))
    return sorted(found)


def fd_counts(pid, dev_dir):
    counts = {}
    for fd in os.listdir("/proc/%d/fd" % pid):
        target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        if target.startswith(str(dev_dir) + "/"):
            counts[os.path.basename(target)] = counts.get(os.path.basename(target), 0) + 1
    return counts


def context_mib(sim_dir, pid):
    with open(os.path.join(sim_dir, "contexts", str(pid))) as context:
        return context.read()


def test_vllm_tree_reports_ready_retitled_and_holding(sim_run, make_workloads):
    run_dir, sim_dir = sim_run
    workloads = make_workloads(run_dir)
    names = ["vllm", "vllm.engine", "vllm.engine.tp0", "vllm.engine.tp1"]
    launcher = workloads.start("vllm", role="api", nbytes=64 * MIB, tp=2)
    infos = workloads.wait_ready(names, launcher, 60)
    assert infos["vllm"]["host_pid"] == launcher.pid
    engine = infos["vllm.engine"]["host_pid"]
    assert procs.read_stat(engine)["ppid"] == launcher.pid
    for rank in (0, 1):
        worker = infos["vllm.engine.tp%d" % rank]
        assert procs.read_stat(worker["host_pid"])["ppid"] == engine
        assert worker["comm"] == "VLLM::Worker_TP" and workloads.marker in worker["cmdline"]
        dev_dir = os.path.join(os.path.dirname(sim_dir), "dev")
        assert open_device_files(worker["host_pid"], dev_dir) == [
            os.path.join(dev_dir, n) for n in ("nvidia-uvm", "nvidia4", "nvidiactl")
        ]
        assert context_mib(sim_dir, worker["host_pid"]) == "0 64\n"
    assert open_device_files(launcher.pid, dev_dir) == [] and open_device_files(engine, dev_dir) == []
    # The API server's SIGKILL orphans EngineCore and its workers, as with vLLM.
    assert workloads.kill("vllm", signal.SIGKILL)
    assert poll_until(lambda: not workloads.alive("vllm"), 10)
    assert all(workloads.alive(name) for name in names[1:])


def test_forked_child_only_inherits_the_handles(sim_run, make_workloads):
    run_dir, sim_dir = sim_run
    workloads = make_workloads(run_dir)
    launcher = workloads.start("inherit", nbytes=32 * MIB, fork_child=True)
    infos = workloads.wait_ready(["inherit", "inherit.child"], launcher, 60)
    parent, child = infos["inherit"], infos["inherit.child"]
    assert procs.read_stat(child["host_pid"])["ppid"] == parent["host_pid"]
    dev_dir = os.path.join(os.path.dirname(sim_dir), "dev")
    assert open_device_files(child["host_pid"], dev_dir) == open_device_files(parent["host_pid"], dev_dir) != []
    assert child["role"] == "inherited"
    assert os.listdir(os.path.join(sim_dir, "contexts")) == [str(parent["host_pid"])]
    assert workloads.kill("inherit")
    assert poll_until(lambda: not workloads.alive("inherit"), 10)
    assert workloads.alive("inherit.child")


def test_cuda_init_opens_the_device_files_and_creates_no_context(sim_run, make_workloads):
    run_dir, sim_dir = sim_run
    workloads = make_workloads(run_dir)
    launcher = workloads.start("cuinit", role="cuinit")
    info = workloads.wait_ready(["cuinit"], launcher, 60)["cuinit"]
    dev_dir = os.path.join(os.path.dirname(sim_dir), "dev")
    assert open_device_files(info["host_pid"], dev_dir) == [
        os.path.join(dev_dir, n) for n in ("nvidia-uvm", "nvidia4", "nvidiactl")
    ]
    for fd in os.listdir("/proc/%d/fd" % info["host_pid"]):  # every handle at position 0: no context token
        with open("/proc/%d/fdinfo/%s" % (info["host_pid"], fd)) as fdinfo:
            assert fdinfo.readline() == "pos:\t0\n"
    assert os.listdir(os.path.join(sim_dir, "contexts")) == []
    assert info["role"] == "cuinit" and info["bytes"] == 0 and info["backend_details"] == {"cuda_init": "sim"}


def test_nvml_client_holds_every_device_file_and_maps_none(sim_run, make_workloads, monkeypatch):
    """The NVML-only client through the simulator's libnvidia-ml.so.1 (tests/sim/build), outside any node: like a real
    one (an H200, driver 580.159.04) it holds nvidiactl, the GPU's file and nvidia-uvm, and maps none of them."""
    run_dir, sim_dir = sim_run
    library_dir = os.path.join(
        os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "sim", "build"
    )
    if not os.path.exists(os.path.join(library_dir, "libnvidia-ml.so.1")):
        pytest.skip("the fake driver library is not built (tests/sim/gpunode build)")
    monkeypatch.setenv("LD_LIBRARY_PATH", library_dir)
    workloads = make_workloads(run_dir)
    launcher = workloads.start("nvml", role="nvml")
    info = workloads.wait_ready(["nvml"], launcher, 60)["nvml"]
    dev_dir = os.path.join(os.path.dirname(sim_dir), "dev")
    assert open_device_files(info["host_pid"], dev_dir) == [
        os.path.join(dev_dir, n) for n in ("nvidia-uvm", "nvidia4", "nvidiactl")
    ]
    assert mappings(info["host_pid"], dev_dir) == []
    assert info["backend_details"] == {"nvml_gpu_count": 1} and os.listdir(os.path.join(sim_dir, "contexts")) == []


def test_sigterm_can_be_ignored(sim_run, make_workloads):
    run_dir, _sim_dir = sim_run
    workloads = make_workloads(run_dir)
    launcher = workloads.start("stubborn", nbytes=MIB, ignore_sigterm=True)
    workloads.wait_ready(["stubborn"], launcher, 60)
    assert workloads.kill("stubborn", signal.SIGTERM)
    assert poll_until(lambda: not workloads.alive("stubborn"), 0.5) is None  # still there after SIGTERM
    assert workloads.kill("stubborn", signal.SIGKILL)
    assert poll_until(lambda: not workloads.alive("stubborn"), 10)


def test_unpinned_processes_end_with_the_lifeline(sim_run, make_workloads):
    run_dir, _sim_dir = sim_run
    workloads = make_workloads(run_dir)
    launcher = workloads.start("vllm", role="api", nbytes=MIB, tp=2)
    workloads.wait_ready(["vllm"], launcher, 60)  # the engine and workers are never pinned
    assert poll_until(
        lambda: all(os.path.exists(os.path.join(run_dir, "vllm.engine.tp%d.json" % r)) for r in (0, 1)), 60
    )
    assert len(procs.processes_with(workloads.marker)) == 4
    assert workloads.stop_all() == []
    assert [pid for pid in procs.processes_with(workloads.marker) if procs.read_stat(pid)["state"] != "Z"] == []


def test_an_allocation_failure_is_reported_at_once(tmp_path, make_workloads):
    if os.path.exists("/proc/driver/nvidia"):
        pytest.skip("this host has the NVIDIA driver")
    workloads = make_workloads(tmp_path, backend="cuda")
    launcher = workloads.start("hold", nbytes=MIB)
    with pytest.raises(WorkloadError, match="hold: WorkloadError: cannot load libcuda.so.1"):
        workloads.wait_ready(["hold"], launcher, 60)


# What the sim backend plants (workload.py PLANTS), as an H200 with driver 580.159.04 showed it.
CONTEXT_MAPPINGS = sorted(
    [("rw-s", 2048, 0, "nvidia4"), ("-w-s", 64, 0, "nvidia4"), ("rw-s", 2048, 0, "nvidia-uvm")]
    + [("rw-s", 4, 0, "nvidiactl")] * 26
)


def test_a_simulated_context_opens_and_maps_as_a_real_one_and_its_child_inherits_all_but_uvm(sim_run, make_workloads):
    run_dir, sim_dir = sim_run
    dev_dir = os.path.join(os.path.dirname(sim_dir), "dev")
    workloads = make_workloads(run_dir)
    launcher = workloads.start("inherit", nbytes=32 * MIB, fork_child=True)
    infos = workloads.wait_ready(["inherit", "inherit.child"], launcher, 60)
    parent, child = infos["inherit"]["host_pid"], infos["inherit.child"]["host_pid"]
    assert fd_counts(parent, dev_dir) == {"nvidiactl": 2, "nvidia-uvm": 4, "nvidia4": 20}
    assert mappings(parent, dev_dir) == CONTEXT_MAPPINGS
    # nvidia-uvm's mapping is not inherited (VM_DONTCOPY in the UVM driver; here MADV_DONTFORK).
    assert mappings(child, dev_dir) == [m for m in CONTEXT_MAPPINGS if m[3] != "nvidia-uvm"]
    # One handle of the GPU's file carries the context's token (the node PID), the others are at position 0.
    positions = []
    for fd in os.listdir("/proc/%d/fd" % parent):
        if os.readlink("/proc/%d/fd/%s" % (parent, fd)).endswith("/nvidia4"):
            with open("/proc/%d/fdinfo/%s" % (parent, fd)) as fdinfo:
                positions.append(int(fdinfo.readline().split()[1]))
    assert sorted(positions) == [0] * 19 + [parent]


@pytest.mark.parametrize("role", ["cuinit", "available"])
def test_cuda_initialized_without_a_context_maps_doorbells_only(sim_run, make_workloads, role):
    run_dir, sim_dir = sim_run
    dev_dir = os.path.join(os.path.dirname(sim_dir), "dev")
    workloads = make_workloads(run_dir)
    info = workloads.wait_ready([role], workloads.start(role, role=role), 60)[role]
    assert fd_counts(info["host_pid"], dev_dir) == {"nvidiactl": 1, "nvidia-uvm": 2, "nvidia4": 3}
    assert mappings(info["host_pid"], dev_dir) == [("-w-s", 64, 0, "nvidia4")] * 2 + [("r--s", 4, 0, "nvidiactl")]
    assert info["role"] == role and os.listdir(os.path.join(sim_dir, "contexts")) == []


@pytest.mark.parametrize(
    "options, reason",
    [
        ({"role": "ipc_export", "nbytes": MIB}, "a simulated node has no CUDA IPC"),
        ({"role": "ipc_import", "ipc_handle": "00" * 64}, "a simulated node has no CUDA IPC"),
        ({"nbytes": MIB, "pinned_bytes": MIB}, "a simulated node has no pinned host memory"),
    ],
)
def test_what_a_simulated_node_cannot_do_fails_with_the_reason(sim_run, make_workloads, options, reason):
    run_dir, _sim_dir = sim_run
    workloads = make_workloads(run_dir)
    with pytest.raises(WorkloadError, match=reason):
        workloads.wait_ready(["w"], workloads.start("w", **options), 60)


def test_a_pid_is_claimed_through_ns_last_pid(tmp_path):
    last_pid = tmp_path / "ns_last_pid"
    claim_pid(4242, str(last_pid))
    assert last_pid.read_text() == "4241"
    with pytest.raises(PidUnavailable, match="PID %d is taken by another process" % os.getpid()):
        claim_pid(os.getpid(), str(last_pid))
    with pytest.raises(PidUnavailable, match="cannot write"):
        claim_pid(4242, str(tmp_path / "absent" / "ns_last_pid"))


def test_a_start_that_did_not_get_the_pid_ends_what_it_started(sim_run, make_workloads, tmp_path):
    """Here ns_last_pid is a plain file (the host's is never written by a unit test): every start gets another PID,
    each is ended and forgotten, and the failure says so."""
    run_dir, _sim_dir = sim_run
    workloads = make_workloads(run_dir)
    free = max(procs.all_pids()) + 10_000_000  # above any pid_max: never given
    with pytest.raises(PidUnavailable, match="went to other processes 3 times"):
        workloads.start_at_pid("reuser", free, attempts=3, last_pid_file=str(tmp_path / "last"), role="cuinit")
    assert workloads.launchers == [] and (tmp_path / "last").read_text() == str(free - 1)
    assert [pid for pid in procs.processes_with(workloads.marker) if procs.read_stat(pid)["state"] != "Z"] == []


def test_a_program_is_pinned_with_its_environment_and_ended_with_the_others(tmp_path, make_workloads):
    workloads = make_workloads(tmp_path)
    launcher = workloads.start_program(
        "sleeper",
        ["/bin/sh", "-c", 'echo "$GPUCHECK_TEST"; exec sleep 60'],
        {"GPUCHECK_TEST": "private pipe directory"},
    )
    assert workloads.alive("sleeper") and workloads.pid("sleeper") == launcher.pid
    assert poll_until(lambda: "private pipe directory" in open(workloads.log_path("sleeper")).read(), 10)
    assert workloads.stop_all() == [] and launcher.poll() is not None
