"""EngineCore and worker processes of the simulated vLLM (V1 engine process model).

EngineCore (`VLLM::EngineCore`) is a child of the API server. With a world size
(tensor x pipeline parallel) of 1 it holds the GPU itself; otherwise it starts one worker per
rank (`VLLM::Worker_TP<r>`, `_PP<p>` when pipeline parallel) that holds its GPU.

- Workers watch a death pipe (their channel to EngineCore) once loading is done
  (vllm/v1/executor/multiproc_executor.py: the death-pipe monitor starts after WorkerProc.__init__, which
  loads the model): when EngineCore is gone they SIGTERM themselves; during loading they go on holding.
  EngineCore has no parent-death detection: it survives the API server's SIGKILL.
- SIGTERM/SIGINT to EngineCore: its handler is installed before construction, and a signal during
  construction (worker start and model loading) is only recorded and applied once loading ends
  (vllm/v1/engine/core.py run_engine_core, shutdown_requested). Stop: the workers are asked to exit, get
  VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (5 s) to do so, then SIGTERM, then SIGKILL 4 s later
  (multiproc_executor.py _ensure_worker_termination); exit 0.
- Knobs (from the API server, read from SIMVLLM_* env there): `load_seconds`,
  `teardown_seconds` (each GPU rank lingers this long after SIGTERM), `workers_ignore_sigterm`,
  `warmup_orphan` (EngineCore keeps SIGTERM's default disposition and workers do not watch the
  death pipe until warm-up ends: a SIGTERM during loading kills EngineCore and orphans its
  workers, vLLM PR 44751), `crash` ("1": EngineCore dies right after it reported ready; "init": after loading the
  weights, before it reports ready).

Channel protocol: parent -> child: one config message first; EngineCore -> worker: {"event":
"warm"} after warm-up; child -> parent: {"event": "ready"}.
"""

import logging
import os
import signal
import socket
import subprocess
import sys
import time

from simvllm import facts
from simvllm.gpu import GpuError, NodeGpus, nccl_init_nvml
from simvllm.runtime import LineChannel, SignalWaker, next_event, process_title, setup_logging, spawn_child

WORKER_TERMINATE_GRACE_S = facts.WORKER_SIGTERM_WAIT

logger = logging.getLogger(__name__)


def child_main(title, channel_fd):
    """Entry point of a child process: `title` is its process title, `channel_fd` its channel."""
    import setproctitle

    setproctitle.setproctitle(title)
    setup_logging(title.split("::", 1)[-1])
    waker = SignalWaker()
    channel = LineChannel(socket.socket(fileno=channel_fd))
    event = next_event(waker, [channel])
    if event[0] != "message":
        return 1
    config = event[2]
    if config["role"] == "engine_core":
        return EngineCore(config, channel, waker).run()
    if config["role"] == "idle":
        return run_idle(config, waker)
    return run_worker(config, channel, waker)


def run_idle(config, waker):
    """A process that holds no GPU (APIServer_<i>, DPCoordinator, the Rust frontend): runs until SIGTERM/SIGINT.

    Its parent's death does not end it (vLLM's API server processes and coordinator have no parent-death signal).
    With `argv` (the Rust frontend binary, `vllm-rs frontend ...`) it takes that command line and comm.
    """
    if config.get("argv"):
        import ctypes
        import setproctitle

        setproctitle.setproctitle(" ".join(config["argv"]))
        name = os.path.basename(config["argv"][0]).encode()[:15]
        ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(name), 0, 0, 0)  # PR_SET_NAME
    waker.watch(signal.SIGTERM, signal.SIGINT)
    while next_event(waker, [])[0] != "signal":
        pass
    return 0


def _utilization(gpus, config, mig):
    """--gpu-memory-utilization, or without it in vLLM 0.34 (None) the extensible KV cache: a cap of 1.0 that takes
    the memory free at start (vllm/v1/worker/utils.py request_memory: no free-memory check; the cache is sized from
    what is free after warm-up), as a fraction of the device's memory."""
    if config["gpu_memory_utilization"] is not None:
        return config["gpu_memory_utilization"]
    total = mig.memory_total_mib if mig else gpus.memory_total_mib
    free = total - gpus.context_mib(config["gpu_index"], mig) if mig else gpus.free_mib(config["gpu_index"])
    return max(free, 0) / total


def _create_context(config):
    """Create the CUDA context of one GPU rank; returns its fds or None after logging the error.

    Device files: those of every GPU in CUDA_VISIBLE_DEVICES (CUDA), the context only on the
    rank's GPU (on a MIG device: the parent's device file and the instance's capability files, see
    simvllm.gpu); with a world size (TP x PP) above 1 the rank also uses NCCL, which keeps NVML
    initialized (every /dev/nvidiaN of the host open) for the life of the process.
    """
    try:
        gpus = NodeGpus.load()
        visible, mig = gpus.enumerate(os.environ.get("CUDA_VISIBLE_DEVICES"))
        mig = mig if mig is not None and mig.index == config["gpu_index"] else None
        fds = gpus.create_context(
            config["gpu_index"], config["local_rank"], _utilization(gpus, config, mig), visible=visible, mig=mig
        )
        if config["tensor_parallel_size"] * config["pipeline_parallel_size"] > 1:
            config["_nvml"] = nccl_init_nvml()
        return fds
    except GpuError as error:
        logger.error("ValueError: %s", error)
    except OSError as error:
        logger.error("RuntimeError: CUDA error: cannot open the GPU: %s", error)
    return None


def _wait_all(processes, seconds):
    """Wait up to `seconds` in all for `processes` (subprocess.Popen) to exit."""
    deadline = time.monotonic() + seconds
    for process in processes:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def _tear_down(teardown_seconds):
    logger.info("Shutting down (teardown %.1f s).", teardown_seconds)
    time.sleep(teardown_seconds)


def run_worker(config, engine, waker):
    """A worker rank: holds one GPU until SIGTERM (or until EngineCore is gone). Returns the exit status."""
    if config["workers_ignore_sigterm"]:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        waker.watch(signal.SIGINT)
    else:
        waker.watch(signal.SIGTERM, signal.SIGINT)
    gpu_fds = _create_context(config)
    if gpu_fds is None:
        return 1
    # vLLM 0.33 multiproc_executor.py setup_proc_title_and_log_prefix: "Worker" until init_device has set the
    # device and built the parallel groups, then the rank's suffixes.
    import setproctitle

    setproctitle.setproctitle(config.get("title") or process_title("Worker"))
    logger.info("Worker rank %d holds GPU %d.", config["rank"], config["gpu_index"])
    try:
        engine.send({"event": "ready"})
    except OSError:
        logger.error("EngineCore is gone before this worker was ready.")
        return 1
    warm = False  # the death-pipe monitor starts once the model is loaded
    while True:
        event = next_event(waker, [engine])
        asked = event[0] == "message" and event[2].get("event") == "shutdown" and not config["workers_ignore_sigterm"]
        if event[0] == "signal" or asked:
            _tear_down(config["teardown_seconds"])
            return 0
        if event[0] == "message" and event[2].get("event") == "warm":
            warm = True
        elif event[0] == "eof":
            if warm:
                logger.info("Parent process exited, terminating worker.")
                os.kill(os.getpid(), signal.SIGTERM)
            else:
                logger.warning("EngineCore is gone during warm-up; waiting in collective.")


def worker_name(rank, tp, pp, dp_size=1, dp_rank=0, expert_parallel=False, pcp=1, dcp=1):
    """A worker's title after its device is set (vLLM 0.33 multiproc_executor.py setup_proc_title_and_log_prefix):
    Worker + _DP<r> (DP > 1), _PP<r> (PP > 1), _PCP<r> (prefill context parallel > 1), _TP<r> (TP > 1),
    _DCP<r> (decode context parallel > 1), _EP<r> (expert parallel; EP spans DP x TP), in the order of
    facts.WORKER_TITLE_PARTS. Ranks: rank = ((pp_rank x pcp) + pcp_rank) x tp + tp_rank; DCP splits TP."""
    tp_rank = rank % tp
    ranks = {
        "DP": (dp_size, dp_rank),
        "PP": (pp, rank // (tp * pcp)),
        "PCP": (pcp, (rank // tp) % pcp),
        "TP": (tp, tp_rank),
        "DCP": (dcp, tp_rank % dcp),
    }
    name = facts.WORKER_TITLE
    for part in facts.WORKER_TITLE_PARTS:
        if part == "EP":
            if expert_parallel:
                name += "_EP%d" % (dp_rank * tp + tp_rank)
        elif ranks[part][0] > 1:
            name += "_%s%d" % (part, ranks[part][1])
    return name


def engine_core_name(dp_size=1, dp_rank=0):
    """EngineCore's title (vLLM 0.33 v1/engine/core.py run_engine_core): EngineCore_DP<n> under data parallelism."""
    return "%s%d" % (facts.ENGINE_CORE_DP_TITLE, dp_rank) if dp_size > 1 or dp_rank > 0 else facts.ENGINE_CORE_TITLE


class EngineCore:
    """The EngineCore process: starts and watches the workers, reports readiness to the API server."""

    def __init__(self, config, api_server, waker):
        self.config = config
        self.api_server = api_server
        self.waker = waker
        self.worker_processes = []
        self.worker_channels = []
        self.gpu_fds = None
        self.shutdown_requested = False

    def run(self):
        """Start, load, serve until SIGTERM. Returns the exit status."""
        config = self.config
        self.waker.watch(signal.SIGINT)
        if not config["warmup_orphan"]:
            self.waker.watch(signal.SIGTERM)
        tp, pp = config["tensor_parallel_size"], config["pipeline_parallel_size"]
        try:
            visible = NodeGpus.load().visible_indices(os.environ.get("CUDA_VISIBLE_DEVICES"))
        except GpuError as error:
            logger.error("RuntimeError: %s", error)
            return 1
        world_size = tp * pp
        if world_size > len(visible):
            logger.error(
                "ValueError: World size (%d) is larger than the number of available GPUs (%d) in this node.",
                world_size,
                len(visible),
            )
            return 1
        if world_size == 1 and config.get("data_parallel_size", 1) == 1:
            self.gpu_fds = _create_context(dict(config, gpu_index=visible[0], local_rank=0))
            if self.gpu_fds is None:
                return 1
        else:
            first = config.get("data_parallel_rank", 0) * world_size  # each DP rank has its own slice of GPUs
            start = self._start_ray_workers if config.get("executor") == "ray" else self._start_workers
            status = start(visible[first : first + world_size], tp, pp)
            if status is not None:
                return status
        logger.info("Starting to load model %s...", config["model"])
        deadline = time.monotonic() + config["load_seconds"]
        while (remaining := deadline - time.monotonic()) > 0:
            status = self._handle_loading_event(next_event(self.waker, self.worker_channels, remaining))
            if status is not None:
                return status
        logger.info("Loading weights took %.2f seconds", config["load_seconds"])
        if config["warmup_orphan"]:
            self.waker.watch(signal.SIGTERM)
        for channel in self.worker_channels:
            try:
                channel.send({"event": "warm"})
            except OSError:
                pass
        if self.shutdown_requested:
            return self.shut_down(0)
        if config["crash"] == "init":
            # vllm/v1/engine/core.py: EngineCoreProc.__init__ builds EngineCore (the weights, then
            # _initialize_kv_caches: profiling and CUDA graph capture) inside _perform_handshakes, which sends READY
            # after it. An error there ends EngineCore before the API server ever listens.
            logger.error("RuntimeError: CUDA error: an illegal memory access was encountered")
            return 1
        try:
            self.api_server.send({"event": "ready"})
        except OSError:
            logger.warning("API server is gone; EngineCore keeps running.")
        if config["crash"] == "1":
            logger.error("EngineCore encountered a fatal error.")
            logger.error("RuntimeError: CUDA error: an illegal memory access was encountered")
            return 1
        while True:
            status = self._handle_serving_event(next_event(self.waker, self.worker_channels))
            if status is not None:
                return status

    def _worker_configs(self, gpu_indices, tp, pp):
        configs = []
        for rank, gpu_index in enumerate(gpu_indices):
            name = worker_name(
                rank,
                tp,
                pp,
                self.config.get("data_parallel_size", 1),
                self.config.get("data_parallel_rank", 0),
                self.config.get("enable_expert_parallel", False),
            )
            configs.append(
                dict(
                    self.config,
                    role="worker",
                    rank=rank,
                    local_rank=rank,
                    gpu_index=gpu_index,
                    title=process_title(name),
                )
            )
        return configs

    def _start_ray_workers(self, gpu_indices, tp, pp):
        """Ray executor (vllm/v1/executor/ray_executor_v2.py): the workers are actors the node's raylet starts (see
        simvllm.raylet), reached at RAY_ADDRESS; the raylet's connection stands for them all."""
        address = os.environ.get("RAY_ADDRESS")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(address or "")
        except OSError as error:
            logger.error("ConnectionError: could not connect to the Ray cluster at RAY_ADDRESS=%s: %s", address, error)
            return 1
        channel = LineChannel(sock)
        self.worker_channels.append(channel)
        channel.send({"event": "job", "workers": self._worker_configs(gpu_indices, tp, pp)})
        while True:
            event = next_event(self.waker, self.worker_channels)
            if event[0] == "message":
                return None
            if event[0] == "signal":
                self._defer(event)
            elif event[0] == "eof":
                logger.error("RayWorkerProc actors failed to start.")
                return self.shut_down(1)

    def _start_workers(self, gpu_indices, tp, pp):
        """Start one worker per rank and wait until all hold their GPU; None on success, else the exit status."""
        for config in self._worker_configs(gpu_indices, tp, pp):
            process, channel = spawn_child(process_title("Worker"))
            self.worker_processes.append(process)
            self.worker_channels.append(channel)
            channel.send(config)
        waiting = set(self.worker_channels)
        while waiting:
            event = next_event(self.waker, self.worker_channels)
            if event[0] == "message":
                waiting.discard(event[1])
            elif event[0] == "signal":
                self._defer(event)
            elif event[0] == "eof":
                logger.error("WorkerProc failed to start.")
                return self.shut_down(1)
        return None

    def _defer(self, event):
        """A signal during construction: recorded, applied once loading ends (core.py shutdown_requested)."""
        logger.info(
            "[shutdown] EngineCore: trigger received signal=%s (deferred until start-up ends)",
            signal.Signals(event[1]).name,
        )
        self.shutdown_requested = True

    def _handle_loading_event(self, event):
        """During model loading: a signal is deferred, a worker's death ends EngineCore."""
        if event[0] == "signal":
            self._defer(event)
            return None
        return self._handle_serving_event(event)

    def _handle_serving_event(self, event):
        """React to a signal or a worker's death; returns the exit status or None to keep serving."""
        if event[0] == "signal":
            return self.shut_down(0)
        if event[0] == "eof":
            logger.error("A worker process died unexpectedly, shutting down executor.")
            return self.shut_down(1)
        return None

    def shut_down(self, status):
        """Ask the workers to exit, wait VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS, SIGTERM, SIGKILL after 4 s, tear
        down; returns `status` (multiproc_executor.py shutdown, _ensure_worker_termination)."""
        logger.info("Shutting down EngineCore.")
        processes = self.worker_processes
        for channel in self.worker_channels:
            try:
                channel.send({"event": "shutdown"})
            except OSError:
                pass
        value = os.environ.get(facts.WORKER_SHUTDOWN_TIMEOUT_ENV)
        grace = float(int(value)) if value not in (None, "") else facts.WORKER_SHUTDOWN_TIMEOUT_DEFAULT
        _wait_all(processes, grace)
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        _wait_all(processes, WORKER_TERMINATE_GRACE_S)
        for process in processes:
            if process.poll() is None:
                logger.warning("Worker %d did not exit within %.0f s: SIGKILL.", process.pid, WORKER_TERMINATE_GRACE_S)
                process.kill()
                process.wait()
        if self.gpu_fds is not None:
            _tear_down(self.config["teardown_seconds"])
        sys.stdout.flush()
        return status
