"""Tests of the simulated vLLM (tests/sim/simvllm), run outside a node.

Each test gets its own run directory (GPUSIM_RUN) holding node.conf, contexts/ and dev/ with
regular files standing in for /dev/nvidia*; the real /dev is never touched. Every `vllm serve`
starts in a new session; the fixture SIGKILLs whatever is left of that session (orphans keep
their session ID), so nothing survives a test.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

import polling
from ports import free_ports

SIM_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(SIM_DIR))

from simvllm.specdecode import SpeculativeConfigError, SpeculativeDecoding  # noqa: E402

LAUNCHER = "import sys; sys.path.insert(0, sys.argv.pop(1)); from simvllm.cli import main; sys.exit(main())"
MEMORY_TOTAL_MIB = 81559
RESERVED_MIB = 529
GPUS = 8
MINORS = [7, 6, 5, 4, 3, 2, 1, 0]
DEFAULT_CONTEXT_MIB = int(0.92 * MEMORY_TOTAL_MIB)  # vLLM 0.33 default gpu_memory_utilization
POLL_S = 0.05

DRAFTER_CONFIG = {
    "architectures": ["DFlashDraftModel"],
    "block_size": 16,
    "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]},
    "layer_types": ["sliding_attention"] * 4 + ["full_attention"],
    "sliding_window": 2048,
    "num_hidden_layers": 5,
    "num_target_layers": 64,
}
GUESSED = {"target_layer_ids": [1, 17, 33, 49, 63], "mask_token_id": 248064, "layer_types": ["full_attention"] * 5}
V2_RUNNER = {"VLLM_USE_V2_MODEL_RUNNER": "1"}


# ---------------------------------------------------------------- helpers


def wait_for(predicate, timeout, what, log=None):
    """polling.wait_for every 50 ms (fails after `timeout` s, with `log()`)."""
    return polling.wait_for(predicate, timeout, POLL_S, what, log)


def assert_stays(predicate, seconds, what):
    """Check `predicate` every 50 ms for `seconds` s."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), what
        time.sleep(POLL_S)


def alive(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def title(pid):
    with open("/proc/%d/cmdline" % pid, "rb") as cmdline:
        return cmdline.read().split(b"\0", 1)[0].decode()


def comm(pid):
    with open("/proc/%d/comm" % pid) as comm_file:
        return comm_file.read().strip()


def children(pid):
    try:
        return [child.pid for child in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def pipe_ends(pid, mode):
    """Inodes of the pipes `pid` holds on fds 3 and up open for `mode` (os.O_RDONLY or os.O_WRONLY)."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        with open("/proc/%d/fdinfo/%s" % (pid, fd)) as fdinfo:
            flags = int([line.split()[1] for line in fdinfo if line.startswith("flags:")][0], 8)
        if int(fd) > 2 and target.startswith("pipe:") and flags & os.O_ACCMODE == mode:
            inodes.add(target)
    return inodes


def holds_sentinel(parent, child):
    """True when `parent` reads a pipe that `child` writes, as multiprocessing's Process.sentinel."""
    return bool(pipe_ends(parent, os.O_RDONLY) & pipe_ends(child, os.O_WRONLY))


def free_port():
    return free_ports(1)[0]


def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def http(port, method, path, body=None, headers=None):
    """One request to 127.0.0.1:`port`; returns (status, body text)."""
    headers = dict(headers or {})
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    request = urllib.request.Request("http://127.0.0.1:%d%s" % (port, path), data, headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def health(port):
    """Status of GET /health, or None while nothing listens."""
    try:
        return http(port, "GET", "/health")[0]
    except (ConnectionError, urllib.error.URLError):
        return None


def metric_samples(text, name):
    """{labels string: value} of the samples of metric `name` in Prometheus text."""
    pattern = re.compile(r"^%s\{([^}]*)\} (\S+)$" % re.escape(name))
    return {match.group(1): float(match.group(2)) for match in map(pattern.match, text.splitlines()) if match}


def metric(text, name):
    samples = metric_samples(text, name)
    assert len(samples) == 1, "want one sample of %s in:\n%s" % (name, text)
    return next(iter(samples.values()))


# ---------------------------------------------------------------- fixtures


class SimNode:
    """A run directory standing in for a node: node.conf, contexts/, dev/nvidia*."""

    def __init__(self, root):
        self.run_dir = root / "run"
        self.dev_dir = root / "dev"
        self.contexts_dir = self.run_dir / "contexts"
        self.contexts_dir.mkdir(parents=True)
        self.dev_dir.mkdir()
        for name in ["nvidiactl", "nvidia-uvm"] + ["nvidia%d" % minor for minor in MINORS]:
            (self.dev_dir / name).touch()
        (self.run_dir / "node.conf").write_text(
            "gpus=%d\nmemory_total_mib=%d\nminors=%s\nreserved_mib=%d\ndev_dir=%s\n"
            % (GPUS, MEMORY_TOTAL_MIB, ",".join(map(str, MINORS)), RESERVED_MIB, self.dev_dir)
        )

    def context(self, pid):
        """Content of the context file of `pid`, or None."""
        try:
            return (self.contexts_dir / str(pid)).read_text()
        except FileNotFoundError:
            return None

    def device_handles(self, pid):
        """{device file name: [file positions]} of the nvidia files `pid` holds open."""
        handles = {}
        for fd in os.listdir("/proc/%d/fd" % pid):
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
                with open("/proc/%d/fdinfo/%s" % (pid, fd)) as fdinfo:
                    position = int(fdinfo.readline().split()[1])
            except (FileNotFoundError, ProcessLookupError):
                continue
            if os.path.dirname(target) == str(self.dev_dir):
                handles.setdefault(os.path.basename(target), []).append(position)
        return handles

    def read_write_gpu_maps(self, pid):
        """Names of the /dev/nvidiaN files `pid` maps `rw-s` (one entry per mapping)."""
        with open("/proc/%d/maps" % pid) as maps:
            lines = [line.split() for line in maps]
        return [
            os.path.basename(fields[5])
            for fields in lines
            if len(fields) >= 6
            and fields[1] == "rw-s"
            and os.path.dirname(fields[5]) == str(self.dev_dir)
            and os.path.basename(fields[5])[6:].isdigit()
        ]

    def holds_gpu(self, pid, index):
        """True when `pid` holds a context on GPU `index` per the contract."""
        handles = self.device_handles(pid)
        return pid in handles.get("nvidia%d" % MINORS[index], []) and "nvidiactl" in handles and "nvidia-uvm" in handles


@pytest.fixture
def node(tmp_path):
    return SimNode(tmp_path)


class Server:
    """One `vllm serve` started by the `serve` fixture."""

    def __init__(self, node, args, env, log_path):
        self.node = node
        self.port = free_port()
        self.log_path = log_path
        self.started = time.time()
        with open(log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-c", LAUNCHER, str(SIM_DIR), "serve", "/models/m", "--port", str(self.port), *args],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.process.pid

    def log(self):
        return self.log_path.read_text()

    def engine_core(self):
        """PID of EngineCore (waits for it)."""

        def find():
            return next((pid for pid in children(self.pid) if title(pid) == "VLLM::EngineCore"), None)

        return wait_for(find, 10, "EngineCore", self.log)

    def workers(self, engine_core, count):
        """{title: pid} of EngineCore's `count` workers, once each holds its context and has its rank title.

        (Each is titled VLLM::Worker until its device is set, as in vLLM 0.33.)"""

        def find():
            found = {title(pid): pid for pid in children(engine_core) if title(pid).startswith("VLLM::Worker_")}
            return found if len(found) == count and all(self.node.context(pid) for pid in found.values()) else None

        return wait_for(find, 15, "%d workers holding contexts" % count, self.log)

    def wait_ready(self):
        wait_for(lambda: health(self.port) == 200, 15, "/health 200", self.log)

    def session(self):
        """Processes of this server's session still running (orphans included)."""
        found = []
        for process in psutil.process_iter(["create_time", "status"]):
            try:
                if (
                    os.getsid(process.pid) == self.pid
                    and process.info["create_time"] >= self.started - 1
                    and process.info["status"] != psutil.STATUS_ZOMBIE
                ):
                    found.append(process)
            except (ProcessLookupError, PermissionError):
                continue
        return found

    def kill_all(self):
        for process in self.session():
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="session")
def fake_driver_dir():
    """Directory of the fake libnvidia-ml.so.1 (built by tests/sim/fakenvml/build.sh)."""
    build = Path(__file__).resolve().parents[1] / "fakenvml" / "build.sh"
    result = subprocess.run(["bash", str(build)], check=True, capture_output=True, text=True)
    return Path(result.stdout.strip()).parent


@pytest.fixture
def serve(node, tmp_path, fake_driver_dir):
    """Factory: serve(*args, **env) starts `vllm serve /models/m --port P *args` with knobs `env`."""
    servers = []

    def start(*args, **env):
        environment = {
            name: value
            for name, value in os.environ.items()
            if not name.startswith(("SIMVLLM_", "VLLM_", "CUDA_VISIBLE_DEVICES"))
        }
        environment.update(GPUSIM_RUN=str(node.run_dir), SIMVLLM_LOAD_SECONDS="0.3")
        # The fake driver library, for the NVML that TP workers initialize as NCCL does.
        environment["LD_LIBRARY_PATH"] = str(fake_driver_dir)
        environment.update(env)
        server = Server(node, [str(arg) for arg in args], environment, tmp_path / ("vllm-%d.log" % len(servers)))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.kill_all()


@pytest.fixture
def drafter(tmp_path):
    """A DFlash drafter directory (config.json as trained); returns its path."""
    path = tmp_path / "drafter"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(DRAFTER_CONFIG))
    return path


# ---------------------------------------------------------------- process model


def test_tp8_engine_core_and_eight_workers_each_hold_their_gpu(node, serve):
    server = serve("--tensor-parallel-size", 8, "--gpu-memory-utilization", 0.5)
    engine_core = server.engine_core()
    workers = server.workers(engine_core, 8)

    assert sorted(workers) == sorted("VLLM::Worker_TP%d" % rank for rank in range(8))
    assert comm(engine_core) == "VLLM::EngineCor"
    assert psutil.Process(engine_core).ppid() == server.pid
    assert "serve" in psutil.Process(server.pid).cmdline()
    for rank in range(8):
        pid = workers["VLLM::Worker_TP%d" % rank]
        assert comm(pid) == ("VLLM::Worker_TP%d" % rank)[:15]
        assert node.holds_gpu(pid, rank), node.device_handles(pid)
        handles = node.device_handles(pid)
        # CUDA opens every visible GPU (all 8: CUDA_VISIBLE_DEVICES unset) four times and NCCL's NVML opens
        # every GPU again, all at position 0; only the rank's own GPU carries the context token, and only its
        # file is mapped read-write (tests/sim/README.md, "Device files per process kind").
        assert sorted(name for name in handles if name.startswith("nvidia") and name[6:].isdigit()) == sorted(
            "nvidia%d" % minor for minor in MINORS
        )
        assert [name for name, positions in handles.items() if pid in positions] == ["nvidia%d" % MINORS[rank]]
        assert all(handles["nvidia%d" % minor] == [0] * 5 for minor in MINORS if minor != MINORS[rank])
        assert node.read_write_gpu_maps(pid) == ["nvidia%d" % MINORS[rank]]
        assert node.context(pid) == "%d %d\n" % (rank, int(0.5 * MEMORY_TOTAL_MIB))
    assert node.device_handles(engine_core) == {}
    assert node.device_handles(server.pid) == {}
    # Started as multiprocessing starts them: each starter reads its child's sentinel pipe.
    assert holds_sentinel(server.pid, engine_core)
    assert all(holds_sentinel(engine_core, pid) for pid in workers.values())
    server.wait_ready()


def test_tp1_engine_core_holds_the_first_visible_gpu(node, serve):
    server = serve(CUDA_VISIBLE_DEVICES="5,2")
    engine_core = server.engine_core()
    wait_for(lambda: node.context(engine_core), 10, "EngineCore's context", server.log)

    assert node.context(engine_core) == "5 %d\n" % DEFAULT_CONTEXT_MIB
    assert node.holds_gpu(engine_core, 5)
    server.wait_ready()
    assert children(engine_core) == []


def test_pipeline_parallel_worker_titles(serve):
    server = serve("-tp", 2, "-pp", 2)
    workers = server.workers(server.engine_core(), 4)
    assert sorted(workers) == ["VLLM::Worker_PP%d_TP%d" % (p, t) for p in range(2) for t in range(2)]


def test_sigkill_of_api_server_orphans_engine_core_and_workers(node, serve):
    server = serve("-tp", 4)
    engine_core = server.engine_core()
    workers = server.workers(engine_core, 4)
    server.wait_ready()

    server.process.send_signal(signal.SIGKILL)
    server.process.wait()

    assert refused(server.port)
    assert psutil.Process(engine_core).ppid() != server.pid

    def tree_holds():
        return alive(engine_core) and all(
            node.holds_gpu(workers["VLLM::Worker_TP%d" % rank], rank) for rank in range(4)
        )

    assert_stays(tree_holds, 1.5, "EngineCore and its workers keep running and holding their GPUs")


def test_sigkill_of_engine_core_ends_workers_then_api_server(serve):
    server = serve("-tp", 4)
    engine_core = server.engine_core()
    workers = server.workers(engine_core, 4)
    server.wait_ready()

    os.kill(engine_core, signal.SIGKILL)

    wait_for(lambda: health(server.port) in (503, None), 5, "/health 503", server.log)
    wait_for(lambda: not any(alive(pid) for pid in workers.values()), 5, "workers to exit", server.log)
    assert server.process.wait(timeout=5) == 1


def test_sigterm_to_api_server_while_serving_kills_the_tree_at_once(node, serve):
    """--shutdown-timeout 0 (default): EngineCore's window is 0, so kill_process_tree follows the SIGTERM at once
    (vllm/v1/engine/utils.py get_engine_process_shutdown_timeout, vllm/v1/utils.py shutdown)."""
    server = serve("-tp", 4, SIMVLLM_TEARDOWN_SECONDS="10")
    server.workers(server.engine_core(), 4)
    server.wait_ready()

    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)

    assert server.process.wait(timeout=5) == 0
    wait_for(lambda: not server.session(), 2, "every process to exit", server.log)
    assert time.monotonic() - started < 2.5  # the 10 s teardown was cut short by SIGKILL
    assert "force killing remaining process EngineCore" in server.log()


def test_sigterm_during_loading_is_deferred_then_the_tree_is_killed_after_5_seconds(node, serve):
    """A SIGTERM during start-up: KeyboardInterrupt in the API server, EngineCore defers its stop until loading
    ends, and the API server kills the tree after VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (5 s); it exits by SIGINT."""
    server = serve("-tp", 2, SIMVLLM_LOAD_SECONDS="30")
    workers = server.workers(server.engine_core(), 2)

    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert_stays(
        lambda: all(node.holds_gpu(workers["VLLM::Worker_TP%d" % r], r) for r in range(2)),
        4.0,
        "loading workers keep their GPUs during the window",
    )
    assert server.process.wait(timeout=4) == -signal.SIGINT
    wait_for(lambda: not server.session(), 2, "every process to exit", server.log)
    assert 5.0 <= time.monotonic() - started < 7.5
    assert "deferred until start-up ends" in server.log()


def test_worker_shutdown_timeout_sets_the_window_with_a_zero_shutdown_timeout(node, serve):
    """VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS set: it replaces the zero window, so a 1.5 s teardown completes."""
    server = serve("-tp", 2, SIMVLLM_TEARDOWN_SECONDS="1.5", VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS="4")
    workers = server.workers(server.engine_core(), 2)
    server.wait_ready()

    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert_stays(lambda: node.holds_gpu(workers["VLLM::Worker_TP0"], 0), 1.0, "worker holds its GPU during teardown")
    wait_for(lambda: not server.session(), 4, "every process to exit", server.log)
    assert 1.5 <= time.monotonic() - started < 4.0
    assert "force killing" not in server.log()


def test_engine_core_sigkilled_after_load_deferral_leaves_nothing(node, serve):
    """API server SIGKILLed during loading: EngineCore applies nothing until loading ends; workers do not watch the
    death pipe yet. A SIGTERM to EngineCore during loading is applied once loading is done."""
    server = serve("-tp", 2, SIMVLLM_LOAD_SECONDS="3")
    engine_core = server.engine_core()
    workers = server.workers(engine_core, 2)
    started = time.monotonic()
    os.kill(engine_core, signal.SIGTERM)
    assert_stays(
        lambda: alive(engine_core) and all(alive(pid) for pid in workers.values()),
        2.0,
        "EngineCore and its workers keep loading",
    )
    wait_for(
        lambda: not alive(engine_core) and not any(alive(pid) for pid in workers.values()),
        4,
        "EngineCore and its workers to exit once loaded",
        server.log,
    )
    assert time.monotonic() - started >= 2.9


def test_sigterm_with_shutdown_timeout_exits_once_idle(serve):
    server = serve("--shutdown-timeout", 30)
    server.wait_ready()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=3) == 0
    assert refused(server.port)


def test_workers_ignoring_sigterm_are_sigkilled_after_the_grace_and_4_seconds(serve):
    """EngineCore's own stop (SIGTERM to EngineCore): the workers get VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS, then
    SIGTERM, then SIGKILL 4 s later (multiproc_executor.py _ensure_worker_termination)."""
    server = serve("-tp", 2, SIMVLLM_WORKERS_IGNORE_SIGTERM="1", VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS="1")
    engine_core = server.engine_core()
    workers = server.workers(engine_core, 2)
    server.wait_ready()

    started = time.monotonic()
    os.kill(engine_core, signal.SIGTERM)
    wait_for(lambda: not any(alive(pid) for pid in workers.values()), 8, "workers to exit", server.log)
    elapsed = time.monotonic() - started

    assert 5.0 <= elapsed < 7.0
    assert server.log().count("SIGKILL") == 2


def test_sigterm_during_warm_up_orphans_workers(node, serve):
    server = serve("-tp", 2, SIMVLLM_WARMUP_ORPHAN="1", SIMVLLM_LOAD_SECONDS="30")
    engine_core = server.engine_core()
    workers = server.workers(engine_core, 2)

    server.process.send_signal(signal.SIGTERM)

    assert server.process.wait(timeout=7) == -signal.SIGINT
    wait_for(lambda: not alive(engine_core), 5, "EngineCore to die", server.log)
    assert all(psutil.Process(pid).ppid() != engine_core for pid in workers.values())
    assert_stays(
        lambda: all(node.holds_gpu(workers["VLLM::Worker_TP%d" % r], r) for r in range(2)),
        1.5,
        "orphaned workers keep running and holding their GPUs",
    )


def test_engine_core_crash_after_load_fails_health_and_exits_1(serve):
    server = serve(SIMVLLM_CRASH="1")
    wait_for(lambda: health(server.port) == 503, 10, "/health 503", server.log)
    assert server.process.wait(timeout=5) == 1
    wait_for(lambda: not server.session(), 5, "every process to exit", server.log)


def test_engine_core_crash_before_ready_never_listens_and_exits_1(serve):
    server = serve(SIMVLLM_CRASH="init")
    assert server.process.wait(timeout=15) == 1
    assert health(server.port) is None  # the port never listened
    assert "Engine core initialization failed" in server.log() and "illegal memory access" in server.log()
    wait_for(lambda: not server.session(), 5, "every process to exit", server.log)


@pytest.mark.parametrize(
    "args, env, status, message",
    [
        (["--gpu-memory-utilization", 0.9], {"CUDA_VISIBLE_DEVICES": "3"}, 1, "Free memory on device cuda:0"),
        (["-tp", 2], {"CUDA_VISIBLE_DEVICES": "2,3"}, 1, "Free memory on device cuda:1"),
        (
            ["-tp", 8],
            {"CUDA_VISIBLE_DEVICES": "0,1"},
            1,
            "World size (8) is larger than the number of available GPUs (2)",
        ),
        (["--speculative-config", "{not json"], {}, 2, "invalid JSON value"),
        (
            [
                "--speculative-config",
                '{"method": "dflash", "model": "/nonexistent/drafter", "num_speculative_tokens": 15}',
            ],
            {},
            1,
            "Invalid repository ID or local directory specified: '/nonexistent/drafter'",
        ),
    ],
    ids=["free-memory", "free-memory-tp2", "too-few-gpus", "invalid-json", "missing-drafter"],
)
def test_start_failures(node, serve, args, env, status, message):
    (node.contexts_dir / "999999").write_text("3 40000\n")  # another process's context on GPU 3
    server = serve(*args, **env)
    assert server.process.wait(timeout=15) == status
    assert message in server.log()
    wait_for(lambda: not server.session(), 5, "every process to exit", server.log)


def test_free_memory_counts_reserved_memory(node, serve):
    server = serve("--gpu-memory-utilization", 1.0)
    assert server.process.wait(timeout=15) == 1
    assert "Free memory on device cuda:0 (79.13/79.65 GiB)" in server.log()


def test_start_fails_without_node_conf(node, serve):
    (node.run_dir / "node.conf").unlink()
    server = serve()
    assert server.process.wait(timeout=15) == 1
    assert "Failed to infer device type" in server.log()


# ---------------------------------------------------------------- HTTP


def test_http_refused_while_loading_then_openai_endpoints(node, serve):
    server = serve("--max-model-len", 64, SIMVLLM_LOAD_SECONDS="1.5")
    engine_core = server.engine_core()
    wait_for(lambda: node.context(engine_core), 10, "EngineCore's context", server.log)
    assert refused(server.port)

    server.wait_ready()
    assert "Starting vLLM API server on http://0.0.0.0:%d" % server.port in server.log()
    status, body = http(server.port, "GET", "/v1/models")
    assert status == 200
    assert json.loads(body) == {
        "object": "list",
        "data": [
            {
                "id": "/models/m",
                "object": "model",
                "created": json.loads(body)["data"][0]["created"],
                "owned_by": "vllm",
                "root": "/models/m",
                "parent": None,
                "max_model_len": 64,
            }
        ],
    }
    assert json.loads(http(server.port, "GET", "/version")[1])["version"]

    status, body = http(
        server.port, "POST", "/v1/completions", {"model": "/models/m", "prompt": "one two three", "max_tokens": 7}
    )
    completion = json.loads(body)
    assert status == 200
    assert completion["object"] == "text_completion"
    assert len(completion["choices"][0]["text"].split()) == 7
    assert completion["usage"] == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}
    again = json.loads(http(server.port, "POST", "/v1/completions", {"prompt": "one two three", "max_tokens": 7})[1])
    assert again["choices"][0]["text"] == completion["choices"][0]["text"]

    status, body = http(
        server.port,
        "POST",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5},
    )
    assert status == 200
    assert len(json.loads(body)["choices"][0]["message"]["content"].split()) == 5

    assert http(server.port, "POST", "/v1/completions", {"model": "other", "prompt": "x"})[0] == 404
    status, body = http(server.port, "POST", "/v1/completions", {"prompt": "x", "max_tokens": 64})
    assert status == 400 and "maximum context length is 64 tokens" in body

    metrics = http(server.port, "GET", "/metrics")[1]
    assert metric_samples(metrics, "vllm:prompt_tokens_total") == {'engine="0",model_name="/models/m"': 3 + 3 + 2}
    assert metric(metrics, "vllm:generation_tokens_total") == 7 + 7 + 5
    assert metric(metrics, "vllm:num_requests_running") == 0
    assert "spec_decode" not in metrics


def test_api_key_guards_v1_only(serve):
    server = serve("--api-key", "secret", "--served-model-name", "a", "b")
    server.wait_ready()
    bearer = {"Authorization": "Bearer secret"}

    assert http(server.port, "GET", "/v1/models")[0] == 401
    assert http(server.port, "GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
    assert http(server.port, "POST", "/v1/completions", {"prompt": "x"})[0] == 401
    status, body = http(server.port, "GET", "/v1/models", headers=bearer)
    assert status == 200
    assert [model["id"] for model in json.loads(body)["data"]] == ["a", "b"]
    assert http(server.port, "POST", "/v1/completions", {"model": "b", "prompt": "x"}, bearer)[0] == 200
    assert health(server.port) == 200
    assert http(server.port, "GET", "/metrics")[0] == 200


def test_api_key_from_environment(serve):
    server = serve(VLLM_API_KEY="envkey")
    server.wait_ready()
    assert http(server.port, "GET", "/v1/models")[0] == 401
    assert http(server.port, "GET", "/v1/models", headers={"Authorization": "Bearer envkey"})[0] == 200


# ---------------------------------------------------------------- speculative decoding


LEGACY = {"SIMVLLM_VERSION": "0.26"}


@pytest.mark.parametrize(
    "extra, env, low, high",
    [
        ({}, {}, 0.6, 0.8),  # vLLM 0.33: the V2 model runner is the default
        ({}, V2_RUNNER, 0.6, 0.8),
        (GUESSED, dict(LEGACY, **V2_RUNNER), 0.0, 0.05),
        ({}, LEGACY, 0.0, 0.05),  # before 0.33 (V1 default) a mixed sliding/full layout ran as all-full
    ],
    ids=["matching", "matching-v2-forced", "guessed-legacy", "matching-legacy-v1"],
)
def test_dflash_acceptance_metrics(serve, drafter, extra, env, low, high):
    speculative_config = dict({"method": "dflash", "model": str(drafter), "num_speculative_tokens": 15}, **extra)
    server = serve("--speculative-config", json.dumps(speculative_config), **env)
    server.wait_ready()
    for index in range(5):
        request = {"prompt": "prompt %d" % index, "max_tokens": 200}
        assert http(server.port, "POST", "/v1/completions", request)[0] == 200

    metrics = http(server.port, "GET", "/metrics")[1]
    drafts = metric(metrics, "vllm:spec_decode_num_drafts_total")
    draft_tokens = metric(metrics, "vllm:spec_decode_num_draft_tokens_total")
    accepted = metric(metrics, "vllm:spec_decode_num_accepted_tokens_total")
    per_position = metric_samples(metrics, "vllm:spec_decode_num_accepted_tokens_per_pos_total")

    assert draft_tokens == 15 * drafts
    assert low <= accepted / draft_tokens <= high
    assert sorted(re.search(r'position="(\d+)"', labels).group(1) for labels in per_position) == sorted(
        str(position) for position in range(15)
    )
    assert sum(per_position.values()) == accepted
    assert accepted + drafts >= 5 * 200  # every draft step yields its accepted tokens plus one


@pytest.mark.parametrize(
    "speculative_config, env, message",
    [
        (
            {"num_speculative_tokens": 15, "target_layer_ids": [1, 16, 31, 46, 61]},
            {},
            "target_layer_ids\n  Extra inputs are not permitted",
        ),
        (
            {"num_speculative_tokens": 15},
            {"VLLM_USE_V2_MODEL_RUNNER": "0"},
            "Model Runner V1 does not support: mixed sliding/full dflash drafts",
        ),
        ({"num_speculative_tokens": 16}, LEGACY, "num_speculative_tokens (16) must be at most block_size - 1 (15)"),
    ],
    ids=["unknown-key", "v1-forced-mixed-layout", "legacy-block-size"],
)
def test_dflash_start_failures(serve, drafter, speculative_config, env, message):
    speculative_config = dict({"method": "dflash", "model": str(drafter)}, **speculative_config)
    server = serve("--speculative-config", json.dumps(speculative_config), **env)
    assert server.process.wait(timeout=15) == 1
    assert message in server.log()


def test_dflash_past_block_size_and_budget(serve, drafter):
    # vLLM 0.33 serves 16 tokens with block_size 16 (no check) ...
    config = {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 16}
    assert SpeculativeDecoding.from_config(config, {}).drafter_agrees
    # ... but refuses max_num_batched_tokens <= K + 1 (vllm/config/vllm.py _set_max_num_scheduled_tokens)
    server = serve("--speculative-config", json.dumps(config), "--max-num-batched-tokens", "17")
    assert server.process.wait(timeout=15) == 1
    assert "Got max_num_batched_tokens=17 and num_lookahead_tokens=17." in server.log()
    assert SpeculativeDecoding.from_config(config, {}, max_num_batched_tokens=18).drafter_agrees


def _agrees(drafter_dir, environ=None, **speculative_keys):
    """drafter_agrees of a DFlash config for `drafter_dir` (legacy keys need SIMVLLM_VERSION < 0.33)."""
    config = dict({"method": "dflash", "model": str(drafter_dir), "num_speculative_tokens": 15}, **speculative_keys)
    if environ is None:
        environ = dict(LEGACY, **V2_RUNNER) if speculative_keys else {}
    return SpeculativeDecoding.from_config(config, environ).drafter_agrees


def _write(drafter, config=None, trained=None):
    (drafter / "config.json").write_text(json.dumps(config or DRAFTER_CONFIG))
    if trained is not None:
        (drafter / "trained.json").write_text(json.dumps(trained))


@pytest.mark.parametrize(
    "config, agrees",
    [
        (DRAFTER_CONFIG, True),
        (dict(DRAFTER_CONFIG, dflash_config={"mask_token_id": 248064, "target_layer_ids": [1, 16, 31, 46, 61]}), False),
        (dict(DRAFTER_CONFIG, dflash_config={"mask_token_id": 248070, "target_layer_ids": [1, 17, 33, 49, 63]}), False),
        (dict(DRAFTER_CONFIG, layer_types=["full_attention"] * 5), False),
        # taps from the top-level target_layer_ids when dflash_config has none (eagle3_utils.py lookup order)
        (dict(DRAFTER_CONFIG, target_layer_ids=[1, 16, 31, 46, 61], dflash_config={"mask_token_id": 248070}), True),
        (dict(DRAFTER_CONFIG, mask_token_id=248070, dflash_config={"target_layer_ids": [1, 16, 31, 46, 61]}), True),
        # dflash_config.is_causal is not read by vLLM 0.33; dflash_config.causal is
        (dict(DRAFTER_CONFIG, dflash_config=dict(DRAFTER_CONFIG["dflash_config"], is_causal=False)), True),
        (dict(DRAFTER_CONFIG, dflash_config=dict(DRAFTER_CONFIG["dflash_config"], causal=False)), False),
    ],
    ids=["as-trained", "mask", "layers", "layout", "top-level-ids", "top-level-mask", "is_causal-ignored", "causal"],
)
def test_dflash_drafter_config_against_training(drafter, config, agrees):
    _write(drafter, config, trained=DRAFTER_CONFIG)
    assert _agrees(drafter) is agrees


def test_unknown_keys_and_methods_are_refused_at_start(drafter):
    for bad in (
        {"method": "dflash", "model": str(drafter), "num_speculative_tokens": 15, "use_swa": True},
        {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": 3, "speculative_token_tree": "[(0,)]"},
        {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": 3, "tensor_parallel_size": 2},
        {"method": "medusa", "model": str(drafter), "num_speculative_tokens": 3},
        {"method": "mlp_speculator", "model": str(drafter), "num_speculative_tokens": 3},
        {"method": "foo_mtp", "model": str(drafter), "num_speculative_tokens": 3},
    ):
        with pytest.raises(SpeculativeConfigError):
            SpeculativeDecoding.from_config(bad, {})
    assert (
        SpeculativeDecoding.from_config(
            {"method": "deepseek_mtp", "model": str(drafter), "num_speculative_tokens": 1}, {}
        ).method
        == "mtp"
    )
    assert (
        SpeculativeDecoding.from_config(
            {"method": "medusa", "model": str(drafter), "num_speculative_tokens": 3}, LEGACY
        ).method
        == "medusa"
    )


def test_worker_and_engine_core_titles():
    from simvllm.engine import engine_core_name, worker_name

    assert worker_name(0, 1, 1) == "Worker"
    assert worker_name(3, 2, 2) == "Worker_PP1_TP1"
    assert worker_name(0, 1, 1, dp_size=2, dp_rank=1) == "Worker_DP1"  # DP > 1 at TP = 1: still a worker
    assert worker_name(1, 2, 1, dp_size=2, dp_rank=1, expert_parallel=True) == "Worker_DP1_TP1_EP3"
    assert engine_core_name() == "EngineCore" and engine_core_name(2, 1) == "EngineCore_DP1"
    # multiproc_executor.py setup_proc_title_and_log_prefix: _DP _PP _PCP _TP _DCP _EP, each when its size > 1
    assert worker_name(5, 2, 2, pcp=2) == "Worker_PP1_PCP0_TP1"
    assert worker_name(3, 4, 1, dcp=2) == "Worker_TP3_DCP1"
    assert (
        worker_name(7, 2, 2, dp_size=2, dp_rank=1, expert_parallel=True, pcp=2, dcp=2)
        == "Worker_DP1_PP1_PCP1_TP1_DCP1_EP3"
    )


@pytest.mark.parametrize(
    "keys, agrees",
    [
        ({}, True),
        ({"target_layer_ids": [1, 16, 31, 46, 61], "mask_token_id": 248070}, True),
        ({"layer_types": DRAFTER_CONFIG["layer_types"]}, True),
        ({"use_swa": True}, True),
        ({"target_layer_ids": [1, 17, 33, 49, 63]}, False),
        ({"target_layer_ids": [2, 17, 32, 47, 62]}, False),
        ({"mask_token_id": 248064}, False),
        ({"use_swa": False}, False),
        ({"layer_types": ["full_attention"] * 5}, False),
    ],
)
def test_dflash_agreement(drafter, keys, agrees):
    assert _agrees(drafter, **keys) is agrees


@pytest.mark.parametrize(
    "stale_layer_ids, agrees",
    [
        ([2, 17, 32, 47, 62], True),  # already shifted by one, as vLLM taps them
        ([1, 16, 31, 46, 61], False),  # off by one
    ],
)
def test_dflash_stale_eagle_aux_layer_ids_win(drafter, stale_layer_ids, agrees):
    config = dict(DRAFTER_CONFIG, eagle_aux_hidden_state_layer_ids=stale_layer_ids)
    _write(drafter, config, trained=DRAFTER_CONFIG)
    assert _agrees(drafter) is agrees
    assert _agrees(drafter, target_layer_ids=[1, 16, 31, 46, 61]) is agrees


def test_eagle_config_aux_ids_replace_the_taps_only_on_the_v1_runner(drafter):
    full = dict(DRAFTER_CONFIG, layer_types=["full_attention"] * 5)
    _write(drafter, dict(full, eagle_config={"eagle_aux_hidden_state_layer_ids": [3, 20, 40]}), trained=full)
    assert _agrees(drafter, {}) is True
    assert _agrees(drafter, {"VLLM_USE_V2_MODEL_RUNNER": "0"}) is False


def test_other_methods(tmp_path):
    eagle = tmp_path / "eagle"
    eagle.mkdir()
    (eagle / "config.json").write_text("{}")
    assert SpeculativeDecoding.from_config(
        {"method": "eagle3", "model": str(eagle), "num_speculative_tokens": 3}, {}
    ).drafter_agrees
    assert SpeculativeDecoding.from_config({"method": "ngram", "num_speculative_tokens": 4}, {}).drafter_agrees
    for bad in (
        {"method": "eagle", "model": str(tmp_path / "missing"), "num_speculative_tokens": 3},
        {"method": "eagle", "num_speculative_tokens": 3},
        {"method": "ngram"},
        {"method": "medusa2", "num_speculative_tokens": 3},
        {"method": "eagle", "model": str(eagle), "num_speculative_tokens": 3, "foo": 1},
    ):
        with pytest.raises(SpeculativeConfigError):
            SpeculativeDecoding.from_config(bad, {})


def test_draft_counts_follow_the_acceptance_rate():
    decoding = SpeculativeDecoding(method="dflash", num_speculative_tokens=15, drafter_agrees=True)
    rate = decoding.acceptance_rate("a prompt")
    counts = decoding.draft("a prompt", 5000)
    assert 0.6 <= rate <= 0.8
    assert counts.num_accepted_tokens / counts.num_draft_tokens == pytest.approx(rate, abs=0.005)
    assert list(counts.accepted_per_position) == sorted(counts.accepted_per_position, reverse=True)


def _titles(pids):
    return sorted(title(pid) for pid in pids)


def test_data_parallel_tree_and_its_stop(node, serve):
    """-dp 2: API servers default to the DP size (vllm/entrypoints/cli/serve.py), a DPCoordinator, EngineCore_DP<i>
    each with a Worker_DP<i> on its own GPU; SIGTERM (--shutdown-timeout 0) ends every process at once."""
    server = serve("-dp", 2)
    server.wait_ready()
    launched = children(server.pid)
    assert _titles(launched) == [
        "VLLM::APIServer_0",
        "VLLM::APIServer_1",
        "VLLM::DPCoordinator",
        "VLLM::EngineCore_DP0",
        "VLLM::EngineCore_DP1",
    ]
    for rank in range(2):
        engine = next(pid for pid in launched if title(pid) == "VLLM::EngineCore_DP%d" % rank)
        (worker,) = children(engine)
        assert title(worker) == "VLLM::Worker_DP%d" % rank and node.holds_gpu(worker, rank)
    assert http(server.port, "GET", "/v1/models")[0] == 200
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=5) == 0
    wait_for(lambda: not server.session(), 2, "every process to exit", server.log)
    assert time.monotonic() - started < 3.0


def test_several_api_servers_and_the_rust_frontend(node, serve):
    server = serve("--api-server-count", 3)
    server.wait_ready()
    assert _titles(children(server.pid)) == [
        "VLLM::APIServer_0",
        "VLLM::APIServer_1",
        "VLLM::APIServer_2",
        "VLLM::EngineCore",
    ]
    rust = serve(
        "--api-server-count",
        2,
        VLLM_USE_RUST_FRONTEND="1",
        VLLM_RUST_FRONTEND_PATH="/opt/vllm/bin/vllm-rs",
        CUDA_VISIBLE_DEVICES="1",
    )
    rust.wait_ready()
    launched = children(rust.pid)
    frontend = [pid for pid in launched if title(pid).startswith("/opt/vllm/bin/vllm-rs")]
    assert len(frontend) == 1 and comm(frontend[0]) == "vllm-rs", _titles(launched)
    assert title(frontend[0]) == "/opt/vllm/bin/vllm-rs frontend --port %d" % rust.port
    assert "VLLM::APIServer_0" not in _titles(launched)  # the Rust frontend ignores --api-server-count > 1


def test_sigkill_of_the_launcher_leaves_api_servers_and_engines(node, serve):
    server = serve("-dp", 2)
    server.wait_ready()
    launched = children(server.pid)
    os.kill(server.pid, signal.SIGKILL)
    server.process.wait()
    assert_stays(lambda: all(alive(pid) for pid in launched), 1.0, "API servers, coordinator and engines survive")


@pytest.fixture
def raylet(node, tmp_path, fake_driver_dir):
    """A simulated raylet (simvllm.raylet) on a unix socket; yields (Popen, socket path)."""
    address = str(tmp_path / "raylet.sock")
    env = {name: value for name, value in os.environ.items() if not name.startswith(("SIMVLLM_", "VLLM_", "CUDA_"))}
    env.update(GPUSIM_RUN=str(node.run_dir), LD_LIBRARY_PATH=str(fake_driver_dir))
    with open(tmp_path / "raylet.log", "wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import sys; sys.path.insert(0, sys.argv[1]); "
                "from simvllm.raylet import main; sys.exit(main(sys.argv[2:]))",
                str(SIM_DIR),
                address,
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    wait_for(lambda: os.path.exists(address), 10, "the raylet's socket")
    yield process, address
    for child in psutil.Process(process.pid).children(recursive=True):
        child.kill()
    process.kill()
    process.wait()


def test_ray_executor_workers_run_under_the_respawning_raylet(node, serve, raylet):
    process, address = raylet
    server = serve("-tp", 2, "--distributed-executor-backend", "ray", RAY_ADDRESS=address)
    server.wait_ready()
    actors = wait_for(lambda: children(process.pid) if len(children(process.pid)) == 2 else None, 10, "two actors")
    assert [title(pid) for pid in actors] == ["ray::RayWorkerProc.run"] * 2
    assert comm(process.pid) == "raylet" and "raylet --raylet_socket_name=" in title(process.pid)
    assert sorted(rank for rank in range(2) for pid in actors if node.holds_gpu(pid, rank)) == [0, 1]
    engine = next(pid for pid in children(server.pid) if title(pid) == "VLLM::EngineCore")
    assert not children(engine)  # no worker under EngineCore: a stop by session or tree misses the actors

    os.kill(actors[0], signal.SIGTERM)  # the raylet starts an ended actor again (1 s later) while its job lives
    wait_for(lambda: not alive(actors[0]), 2, "the actor to exit")
    (node.contexts_dir / str(actors[0])).unlink()  # the driver's release of its context (done by a node's init)
    respawned = wait_for(
        lambda: [pid for pid in children(process.pid) if pid not in actors and node.context(pid)],
        10,
        "the actor restarted",
    )
    assert len(respawned) == 1 and health(server.port) == 200

    server.process.send_signal(signal.SIGTERM)  # the job ends: the raylet ends its actors, and lives on
    assert server.process.wait(timeout=5) == 0
    wait_for(lambda: not children(process.pid), 6, "the job's actors to end")
    assert process.poll() is None
