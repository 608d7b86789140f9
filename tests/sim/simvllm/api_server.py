"""The API server process of the simulated `vllm serve` (the invoked process).

It validates the configuration, binds the HTTP port, starts EngineCore and listens once
EngineCore reports the model loaded (connection refused until then).

- SIGTERM/SIGINT: drain up to --shutdown-timeout seconds, SIGTERM EngineCore, wait up to 5 s,
  then SIGKILL EngineCore and its descendants; exit 0.
- EngineCore gone before it was ready: exit 1 ("Engine core initialization failed").
- EngineCore gone while serving: /health answers 503, the server exits 1 two seconds later.
"""

import logging
import os
import signal
import subprocess
import time

import psutil

from simvllm import __version__
from simvllm.openai_api import ApiHttpServer, ServingState
from simvllm.runtime import SignalWaker, next_event, process_title, setup_logging, spawn_child
from simvllm.specdecode import SpeculativeConfigError, SpeculativeDecoding

ENGINE_SHUTDOWN_GRACE_S = 5.0
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
        "crash": environ.get("SIMVLLM_CRASH") == "1",
    }


def _stop_engine(engine_process):
    """SIGTERM EngineCore; after 5 s SIGKILL it and its descendants (like vLLM's kill_process_tree)."""
    if engine_process.poll() is None:
        engine_process.send_signal(signal.SIGTERM)
    try:
        engine_process.wait(ENGINE_SHUTDOWN_GRACE_S)
        return
    except subprocess.TimeoutExpired:
        pass
    logger.warning("EngineCore did not exit within %.0f s: killing its process tree.", ENGINE_SHUTDOWN_GRACE_S)
    try:
        descendants = psutil.Process(engine_process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        descendants = []
    for process in descendants:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    engine_process.kill()
    engine_process.wait()


def _drain(http_server, state, timeout):
    """Stop accepting connections and wait up to `timeout` s for running requests to finish."""
    http_server.shutdown()
    http_server.server_close()
    deadline = time.monotonic() + timeout
    while state.num_requests_running and time.monotonic() < deadline:
        time.sleep(DRAIN_POLL_S)


def run_api_server(args):
    """Run `vllm serve` with parsed `args` (see simvllm.cli). Returns the exit status."""
    setup_logging("APIServer")
    logger.info("vLLM API server version %s", __version__)
    if args.ignored_arguments:
        logger.warning("Ignoring arguments the simulation does not model: %s", args.ignored_arguments)
    try:
        knobs = knobs_from_env(os.environ)
        speculative = None
        if args.speculative_config is not None:
            speculative = SpeculativeDecoding.from_config(args.speculative_config)
    except (ValueError, SpeculativeConfigError) as error:
        logger.error("ValueError: %s", error)
        return 1
    host = args.host or "0.0.0.0"
    state = ServingState(
        served_model_names=args.served_model_name or [args.model],
        max_model_len=args.max_model_len,
        api_key=args.api_key or os.environ.get("VLLM_API_KEY"),
        speculative=speculative,
    )
    try:
        http_server = ApiHttpServer(host, args.port, state)
    except OSError as error:
        logger.error("OSError: %s", error)
        return 1
    waker = SignalWaker()
    waker.watch(signal.SIGTERM, signal.SIGINT)
    engine_process, engine = spawn_child(process_title("EngineCore"))
    engine.send(dict(
        knobs,
        role="engine_core",
        model=args.model,
        tensor_parallel_size=args.tensor_parallel_size,
        pipeline_parallel_size=args.pipeline_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
    ))
    serving = False
    while True:
        event = next_event(waker, [engine])
        if event[0] == "signal":
            logger.info("Received signal %d, shutting down.", event[1])
            if serving and args.shutdown_timeout > 0:
                _drain(http_server, state, args.shutdown_timeout)
            _stop_engine(engine_process)
            return 0
        if event[0] == "message" and event[2].get("event") == "ready":
            http_server.start_listening()
            serving = True
            logger.info("Starting vLLM API server on http://%s:%d", host, http_server.server_port)
            logger.info("Application startup complete.")
        elif event[0] == "eof":
            status = engine_process.wait()
            if not serving:
                logger.error(
                    "RuntimeError: Engine core initialization failed. See root cause above. "
                    "Failed core proc(s): {'EngineCore': %d}", status)
                return 1
            state.engine_dead = True
            logger.error("Engine core proc EngineCore died unexpectedly (exit status %d), shutting down.", status)
            next_event(waker, [], ENGINE_DEAD_EXIT_DELAY_S)
            return 1
