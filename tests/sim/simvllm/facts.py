"""vLLM 0.33 facts the simulated vLLM follows: shutdown windows, process titles, metrics.

Every value here is read from the vllm 0.33.0 wheel; scripts/check_vllm_source.py (`make check-vllm-source`)
reads the wheel again and fails when one differs. The source of each is beside it.
"""

# vllm/engine/arg_utils.py EngineArgs.shutdown_timeout and vllm/config/vllm.py VllmConfig.shutdown_timeout:
# --shutdown-timeout, seconds the requests in flight may drain on SIGTERM (0: aborted at once).
SHUTDOWN_TIMEOUT_DEFAULT = 0
# vllm/envs.py VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS (int, default 5). vllm/v1/engine/utils.py
# get_engine_process_shutdown_timeout: only when it is set in the environment does it replace a zero
# --shutdown-timeout as EngineCore's window; vllm/v1/executor/multiproc_executor.py _ensure_worker_termination
# always waits this long for the workers before their SIGTERM.
WORKER_SHUTDOWN_TIMEOUT_ENV = "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS"
WORKER_SHUTDOWN_TIMEOUT_DEFAULT = 5.0
# vllm/v1/utils.py shutdown(): the window when no timeout is given (best-effort cleanup paths).
BEST_EFFORT_WINDOW = 5.0
# vllm/v1/executor/multiproc_executor.py _ensure_worker_termination: SIGTERM, then SIGKILL after 4 s.
WORKER_SIGTERM_WAIT = 4.0
# vllm/config/cache.py CacheConfig.gpu_memory_utilization.
GPU_MEMORY_UTILIZATION_DEFAULT = 0.92
# vllm/envs.py VLLM_PROCESS_NAME_PREFIX; vllm/utils/system_utils.py set_process_title: "<prefix>::<name>".
PROCESS_NAME_PREFIX = "VLLM"
# vllm/v1/executor/multiproc_executor.py setup_proc_title_and_log_prefix: "Worker" until the parallel groups
# exist, then Worker + _DP<r> _PP<r> _PCP<r> _TP<r> _DCP<r> (each when that size > 1) + _EP<r> (expert parallel).
WORKER_TITLE = "Worker"
WORKER_TITLE_PARTS = ("DP", "PP", "PCP", "TP", "DCP", "EP")
# vllm/v1/engine/core.py EngineCoreProc.run_engine_core: EngineCore, or EngineCore_DP<rank> with data parallel.
ENGINE_CORE_TITLE = "EngineCore"
ENGINE_CORE_DP_TITLE = "EngineCore_DP"
# vllm/v1/engine/coordinator.py DPCoordinatorProc: the data-parallel coordinator's title.
DP_COORDINATOR_TITLE = "DPCoordinator"
# vllm/v1/utils.py run_api_server_worker_proc: set_process_title("APIServer", str(index)) -> APIServer_<index>.
API_SERVER_TITLE = "APIServer_"
# vllm/v1/metrics/loggers.py PrometheusStatLogger and vllm/v1/spec_decode/metrics.py SpecDecodingProm: the
# metrics the simulator exports, with their kind (prometheus_client adds _total to a counter's samples).
METRICS = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:spec_decode_num_drafts": "counter",
    "vllm:spec_decode_num_draft_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens": "counter",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "counter",
}
# vllm/v1/metrics/loggers.py: labelnames = ["model_name", "engine"]; the model_name value is
# vllm/config/model.py get_served_model_name: the first of --served-model-name ("first").
METRIC_LABELS = ("model_name", "engine")
METRIC_MODEL_NAME = "first"
