"""The API server process of the simulated `vllm serve` (the invoked process).

It validates the configuration, binds the HTTP port, starts EngineCore and listens once
EngineCore reports the model loaded (connection refused until then).

- SIGTERM/SIGINT while serving, as vLLM 0.33 (vllm/entrypoints/launchers/launcher.py serve_http
  handle_shutdown -> engine_client.shutdown(timeout=--shutdown-timeout), vllm/v1/engine/utils.py
  CoreEngineProcManager.shutdown and get_engine_process_shutdown_timeout, vllm/v1/utils.py shutdown):
  with --shutdown-timeout 0 (the default) the running requests are aborted at once; with N > 0 the port
  keeps answering, new requests are aborted (finish_reason "abort") and the running ones may finish
  within N s. EngineCore gets SIGTERM; once the window has passed (N s from the signal; with N = 0
  the value of VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS when it is set, else 0: at once) EngineCore and
  all its descendants get SIGKILL (kill_process_tree). Exit 0.
- SIGTERM/SIGINT during start-up (vllm/entrypoints/launchers/api_server/entry.py run_server:
  KeyboardInterrupt; vllm/v1/engine/core_client.py MPClient.__init__ failure path -> BackgroundResources
  -> engine_manager.shutdown(timeout=VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS)): SIGTERM EngineCore, which
  defers it until loading ends, then SIGKILL its tree after VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS
  (default 5 s). The uncaught KeyboardInterrupt ends the process by SIGINT.
- EngineCore gone before it was ready: exit 1 ("Engine core initialization failed").
- EngineCore gone while serving: /health answers 503, the server exits 1 two seconds later.
"""

import logging
import os
import signal
import subprocess
import sys
import time

import psutil

from simvllm import facts
from simvllm.engine import engine_core_name
from simvllm.openai_api import ApiHttpServer, ServingState
from simvllm.runtime import SignalWaker, next_event, process_title, setup_logging, spawn_child
from simvllm.specdecode import SpeculativeConfigError, SpeculativeDecoding

ENGINE_DEAD_EXIT_DELAY_S = 2.0
DRAIN_POLL_S = 0.05

logger = logging.getLogger(__name__)


def knobs_from_env(environ):
    """Simulation knobs from SIMVLLM_* environment variables (see tests/sim/simvllm/README.md).

    Raises ValueError for a value that is not a number.
    """
    return {
        "load_seconds": float(environ.get("SIMVLLM_LOAD_SECONDS", "1.0")),
        "teardown_seconds": float(environ.get("SIMVLLM_TEARDOWN_SECONDS", "0")),
        "workers_ignore_sigterm": environ.get("SIMVLLM_WORKERS_IGNORE_SIGTERM") == "1",
        "warmup_orphan": environ.get("SIMVLLM_WARMUP_ORPHAN") == "1",
        "crash": environ.get("SIMVLLM_CRASH") if environ.get("SIMVLLM_CRASH") in ("1", "init") else None,
    }


def serving_knobs_from_env(environ):
    """Knobs of the HTTP side: seconds per generated token, seconds until acceptance collapses and until the engine
    stalls (None: never)."""
    collapse = environ.get("SIMVLLM_ACCEPTANCE_COLLAPSE_AFTER")
    stall = environ.get("SIMVLLM_STALL_AFTER")
    return {
        "token_seconds": float(environ.get("SIMVLLM_TOKEN_SECONDS", "0")),
        "collapse_after_s": float(collapse) if collapse not in (None, "") else None,
        "stall_after_s": float(stall) if stall not in (None, "") else None,
    }


def worker_shutdown_timeout(environ):
    """VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (vllm/envs.py: int, default 5) and whether it is set."""
    value = environ.get(facts.WORKER_SHUTDOWN_TIMEOUT_ENV)
    return (float(int(value)), True) if value not in (None, "") else (facts.WORKER_SHUTDOWN_TIMEOUT_DEFAULT, False)


def engine_window(shutdown_timeout, environ):
    """Seconds between EngineCore's SIGTERM and the SIGKILL of its tree on a stop while serving.

    vllm/v1/engine/utils.py get_engine_process_shutdown_timeout(shutdown_timeout, shutdown_timeout): both 0 and
    VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS set -> that value; otherwise --shutdown-timeout itself (0: at once).
    """
    value, is_set = worker_shutdown_timeout(environ)
    if shutdown_timeout == 0 and is_set:
        return value
    return float(shutdown_timeout)


def startup_window(environ):
    """Seconds between EngineCore's SIGTERM and the SIGKILL of its tree on a stop during start-up:
    MPClient's failure path shuts the engine down with timeout=VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (5)."""
    return worker_shutdown_timeout(environ)[0]


def _stop_engine(engine_process, window):
    """vllm/v1/utils.py shutdown([EngineCore], window): SIGTERM, wait `window` s, then kill_process_tree."""
    if engine_process.poll() is None:
        engine_process.send_signal(signal.SIGTERM)
    try:
        engine_process.wait(window)
        return
    except subprocess.TimeoutExpired:
        pass
    logger.warning("[shutdown] Process manager: force killing remaining process EngineCore pid %d", engine_process.pid)
    try:
        descendants = psutil.Process(engine_process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    for process in descendants:  # kill_process_tree (vllm/utils/system_utils.py): the children, then the process
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    engine_process.kill()
    engine_process.wait()


def _drain(state, timeout):
    """vLLM 0.33 shutdown of the requests: new ones aborted, running ones finish within `timeout` s or are aborted."""
    state.begin_shutdown()
    busy = state.busy()
    if timeout == 0:
        if busy:
            logger.info("[shutdown] EngineCore: aborting in-flight requests count=%d", busy)
    else:
        if busy:
            logger.info("[shutdown] EngineCore: draining in-flight requests count=%d timeout=%ds", busy, timeout)
        deadline = time.monotonic() + timeout
        while state.busy() and time.monotonic() < deadline:
            time.sleep(DRAIN_POLL_S)
        if state.busy():
            logger.warning("[shutdown] shutdown timeout of %d s passed: aborting %d request(s)", timeout, state.busy())
    state.abort_all()
    # Let the handlers send their "abort" answers before the process exits.
    deadline = time.monotonic() + 1.0
    while state.busy() and time.monotonic() < deadline:
        time.sleep(DRAIN_POLL_S)


def run_api_server(args):
    """Run `vllm serve` with parsed `args` (see simvllm.cli). Returns the exit status."""
    setup_logging("APIServer")
    logger.info("vLLM API server version %s", facts.version(os.environ))
    if args.ignored_arguments:
        logger.warning("Ignoring arguments the simulation does not model: %s", args.ignored_arguments)
    try:
        knobs = knobs_from_env(os.environ)
        serving_knobs = serving_knobs_from_env(os.environ)
        speculative = None
        if args.speculative_config is not None:
            speculative = SpeculativeDecoding.from_config(
                args.speculative_config, max_num_batched_tokens=getattr(args, "max_num_batched_tokens", None)
            )
    except (ValueError, SpeculativeConfigError) as error:
        logger.error("ValueError: %s", error)
        return 1
    host = args.host or "0.0.0.0"
    state = ServingState(
        served_model_names=args.served_model_name or [args.model],
        max_model_len=args.max_model_len,
        api_key=args.api_key or os.environ.get("VLLM_API_KEY"),
        speculative=speculative,
        max_num_seqs=args.max_num_seqs,
        log_stats=not args.disable_log_stats,
        **serving_knobs,
    )
    try:
        http_server = ApiHttpServer(host, args.port, state)
    except OSError as error:
        logger.error("OSError: %s", error)
        return 1
    waker = SignalWaker()
    waker.watch(signal.SIGTERM, signal.SIGINT)
    mode = launch_mode(args, os.environ)
    problem = _world_size_problem(args, mode)
    if problem:
        logger.error("ValueError: %s", problem)
        return 1
    helpers = start_helpers(mode, args)
    engines = []
    for rank in range(mode["data_parallel_size"]):
        title = engine_core_name(mode["data_parallel_size"], rank)
        process, channel = spawn_child(process_title(title))
        channel.send(
            dict(
                knobs,
                role="engine_core",
                model=args.model,
                tensor_parallel_size=args.tensor_parallel_size,
                pipeline_parallel_size=args.pipeline_parallel_size,
                gpu_memory_utilization=args.gpu_memory_utilization,
                data_parallel_size=mode["data_parallel_size"],
                data_parallel_rank=rank,
                enable_expert_parallel=args.enable_expert_parallel,
                executor=mode["executor"],
            )
        )
        engines.append((process, channel, title))
    return _serve(args, state, http_server, waker, engines, helpers, host)


def _serve(args, state, http_server, waker, engines, helpers, host):
    """The launcher's event loop: listen once every engine is ready, stop on SIGTERM, exit when an engine dies."""
    serving, ready = False, set()
    channels = [channel for _process, channel, _title in engines]
    while True:
        event = next_event(waker, channels)
        if event[0] == "signal":
            logger.info("Received signal %d, shutting down.", event[1])
            logger.info(
                "[shutdown] API server: stopping engine client mode=%s timeout=%ss",
                "drain" if args.shutdown_timeout else "abort",
                args.shutdown_timeout,
            )
            if not serving:
                _stop_during_start_up(engines, helpers)
                return 1
            started = time.monotonic()
            _drain(state, args.shutdown_timeout)
            window = engine_window(args.shutdown_timeout, os.environ)
            left = max(0.0, window - (time.monotonic() - started)) if args.shutdown_timeout else window
            _stop_all([process for process, _channel in helpers], left)
            _stop_all([process for process, _channel, _title in engines], left)
            http_server.shutdown()
            http_server.server_close()
            return 0
        if event[0] == "message" and event[2].get("event") == "ready":
            ready.add(event[1])
            if len(ready) == len(engines) and not serving:
                http_server.start_listening()
                serving = True
                logger.info("Starting vLLM API server on http://%s:%d", host, http_server.server_port)
                logger.info("Application startup complete.")
        elif event[0] == "eof":
            dead = [(process, title) for process, channel, title in engines if channel is event[1]][0]
            status = dead[0].wait()
            if not serving:
                logger.error(
                    "RuntimeError: Engine core initialization failed. See root cause above. "
                    "Failed core proc(s): {'%s': %d}",
                    dead[1],
                    status,
                )
                _stop_all([process for process, _channel, _title in engines] + [p for p, _c in helpers], 0.0)
                return 1
            state.engine_dead = True
            logger.error("Engine core proc %s died unexpectedly (exit status %d), shutting down.", dead[1], status)
            next_event(waker, [], ENGINE_DEAD_EXIT_DELAY_S)
            # vllm/v1/utils.py wait_for_completion_or_failure / the engine manager's finalizer: the other processes
            # are shut down with the best-effort window.
            _stop_all(
                [p for p, _c in helpers] + [p for p, _c, _t in engines if p is not dead[0]], facts.BEST_EFFORT_WINDOW
            )
            return 1


def _stop_during_start_up(engines, helpers):
    """SIGTERM during start-up: KeyboardInterrupt (one API server) or SystemExit (several, vllm/entrypoints/cli/serve.py
    run_multi_api_server) before the engines are up; the engine manager's finalizer then stops them with the
    best-effort window. One API server: the uncaught KeyboardInterrupt ends the process by SIGINT."""
    window = startup_window(os.environ)
    logger.info("KeyboardInterrupt: terminated during start-up; EngineCore gets %.0f s", window)
    _stop_all([process for process, _channel in helpers] + [process for process, _channel, _title in engines], window)
    if helpers:
        return
    # The KeyboardInterrupt is not caught (vllm/entrypoints/cli/main.py): CPython then ends the process by
    # SIGINT's default action (bpo-1054041), so a parent sees it killed by SIGINT.
    sys.stdout.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def _world_size_problem(args, mode):
    """vllm/config/parallel.py: the world size across data parallelism must fit the visible GPUs."""
    from simvllm.gpu import GpuError, NodeGpus

    try:
        visible = NodeGpus.load().visible_indices(os.environ.get("CUDA_VISIBLE_DEVICES"))
    except (GpuError, OSError):
        return None  # EngineCore reports it
    world = args.tensor_parallel_size * args.pipeline_parallel_size * mode["data_parallel_size"]
    if world > len(visible):
        return "World size (%d) is larger than the number of available GPUs (%d) in this node." % (world, len(visible))
    return None


def launch_mode(args, environ):
    """How `vllm serve` lays out its processes (vllm/entrypoints/cli/serve.py ServeSubcommand.cmd):
    {"data_parallel_size", "api_server_count", "rust_frontend" (path or None), "executor" ("mp" or "ray")}.
    --api-server-count defaults to the data-parallel size (internal load balancing), and to 1 with the Rust
    frontend (VLLM_USE_RUST_FRONTEND=1 and VLLM_RUST_FRONTEND_PATH), which ignores a larger count."""
    dp = max(1, args.data_parallel_size)
    rust = (
        environ.get("VLLM_RUST_FRONTEND_PATH") if environ.get("VLLM_USE_RUST_FRONTEND", "0") not in ("", "0") else None
    )
    count = args.api_server_count if args.api_server_count is not None else (1 if rust else dp)
    if rust:
        count = 1
    return {
        "data_parallel_size": dp,
        "api_server_count": count,
        "rust_frontend": rust or None,
        "executor": args.distributed_executor_backend or "mp",
    }


def start_helpers(mode, args):
    """The processes beside the engines: APIServer_<i> (several API servers: vllm/v1/utils.py APIServerProcessManager),
    the Rust frontend (vllm/v1/utils.py RustFrontendProcessManager: `vllm-rs frontend ...`), DPCoordinator (data
    parallel: vllm/v1/engine/coordinator.py). They hold no GPU. The simulated launcher answers HTTP itself: the API
    servers and the frontend stand for the processes an operator sees, not for the HTTP path."""
    helpers = []
    if mode["rust_frontend"]:
        helpers.append(
            _helper(process_title("RustFrontend"), argv=[mode["rust_frontend"], "frontend", "--port", str(args.port)])
        )
    elif mode["api_server_count"] > 1:
        helpers.extend(
            _helper(process_title(facts.API_SERVER_TITLE + str(index))) for index in range(mode["api_server_count"])
        )
    if mode["data_parallel_size"] > 1:
        helpers.append(_helper(process_title(facts.DP_COORDINATOR_TITLE)))
    return helpers


def _helper(title, argv=None):
    process, channel = spawn_child(title)
    channel.send({"role": "idle", "argv": argv})
    return process, channel


def _stop_all(processes, window):
    """vllm/v1/utils.py shutdown(processes, window): SIGTERM each, wait `window` s in all, kill_process_tree the rest."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + window
    for process in processes:
        _stop_engine(process, max(0.0, deadline - time.monotonic()))
