"""vLLM facts the simulated vLLM follows, per release: speculative-config fields and methods, defaults, shutdown
windows, process titles, metrics.

Every value here is read from the vllm wheels (0.32.0, 0.33.0, 0.34.0); scripts/check_vllm_source.py
(`make check-vllm-source`) reads each wheel again and fails when one differs. The source of each is beside it.
The release modelled is SIMVLLM_VERSION (default DEFAULT_VERSION): `version(environ)`; the tables of its series:
`release(environ)` and `facts_of(environ)`. Below 0.32 the simulator's LEGACY behaviours apply (specdecode.py),
with the 0.32.0 tables. The process, shutdown and metric facts are the same in the three releases.
"""

# The releases modelled, oldest first; SIMVLLM_VERSION picks one (another patch release of a series: that series).
VERSIONS = ("0.32.0", "0.33.0", "0.34.0")
DEFAULT_VERSION = "0.33.0"

# vllm/config/speculative.py MTPModelTypes (0.33.0; "mtp" included): run as mtp.
_MTP_METHODS = {
    "deepseek_mtp",
    "dots3_note_mtp",
    "mimo_mtp",
    "mimo_v2_mtp",
    "glm4_moe_mtp",
    "glm4_moe_lite_mtp",
    "glm_ocr_mtp",
    "ernie_mtp",
    "nemotron_h_mtp",
    "exaone_moe_mtp",
    "exaone4_5_mtp",
    "qwen3_next_mtp",
    "qwen4_exp_mtp",
    "qwen3_5_mtp",
    "longcat_flash_mtp",
    "bailing_hybrid_v3_mtp",
    "minimax_m3_mtp",
    "bailing_hybrid_mtp",
    "mtp",
    "kimi_k3_mtp",
    "pangu_ultra_moe_mtp",
    "step3p5_mtp",
    "step5_mtp",
    "hy_v3_mtp",
    "hy_v4_mtp",
    "gemma4_mtp",
    "inkling_mtp",
    "glm5_next_mtp",
}
# vllm/config/speculative.py SpeculativeMethod (0.33.0), less the MTP names, by whether a drafter model is loaded.
_METHODS_WITH_DRAFTER = {"draft_model", "eagle", "eagle3", "dflash", "dspark"}
_METHODS_WITHOUT_DRAFTER = {"ngram", "suffix", "ngram_gpu", "custom_class", "extract_hidden_states"}
# vllm/config/speculative.py SpeculativeConfig (0.33.0): every field, those _verify_args refuses included.
_FIELDS = {
    "enforce_eager",
    "num_speculative_tokens",
    "model",
    "method",
    "draft_tensor_parallel_size",
    "tensor_parallel_size",
    "quantization",
    "moe_backend",
    "attention_backend",
    "kv_cache_dtype",
    "max_model_len",
    "revision",
    "code_revision",
    "index_share_for_mtp_iteration",
    "disable_padded_drafter_batch",
    "disable_eagle_block_drop",
    "disable_lookahead_block_hashes",
    "draft_lm_head_quantization",
    "use_local_argmax_reduction",
    "use_heterogeneous_vocab",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "parallel_drafting",
    "num_speculative_tokens_per_batch_size",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
    "draft_load_config",
    "rejection_sample_method",
    "synthetic_acceptance_rates",
    "synthetic_acceptance_length",
    "enable_adaptive_verification",
    "draft_sample_method",
    "dspark_draft_topk",
    "xpress_topc",
    "fly_window_size",
    "fly_entropy_threshold",
    "fly_entropy_top_k",
}
# What 0.32.0 and 0.34.0 change in the 0.33.0 sets: {name: (added, removed)}.
_SPECULATIVE_CHANGES = {
    "0.32.0": {
        "fields": (
            set(),
            {
                "disable_lookahead_block_hashes",
                "draft_lm_head_quantization",
                "xpress_topc",
                "fly_window_size",
                "fly_entropy_threshold",
                "fly_entropy_top_k",
            },
        ),
        "mtp_methods": (set(), {"step5_mtp"}),
        "methods_with_drafter": ({"medusa", "mlp_speculator"}, set()),
    },
    "0.34.0": {
        "fields": (
            {"draft_decode_context_parallel_size", "suffix_decoding_corpus_tokens", "speculator_options"},
            {"disable_padded_drafter_batch", "use_heterogeneous_vocab"},
        ),
        "mtp_methods": ({"nemotron3_5_transcribe_mtp"}, set()),
        "methods_without_drafter": (set(), {"custom_class"}),
        # custom_method: field(init=False), set by vLLM from a method a plugin registered.
        "set_by_vllm": ({"custom_method"}, set()),
    },
}
# One value per release (0.33.0's here, then what 0.32.0 and 0.34.0 change: _VALUE_CHANGES).
_VALUES = {
    # vllm/config/speculative.py: method `SpeculativeMethod | str`, a method a plugin registers
    # (vllm/v1/worker/gpu/spec_decode/speculator_config.py register_speculative_method).
    "custom_methods": False,
    # vllm/envs.py VLLM_USE_V2_MODEL_RUNNER: a V1 model runner to fall back to.
    "v1_runner": True,
    # vllm/config/vllm.py _set_max_num_scheduled_tokens: max_num_batched_tokens must exceed, per request,
    # num_lookahead_tokens (0.33, 0.34: DFlash K + 1; EAGLE, EAGLE-3, MTP, draft model K) or, in 0.32,
    # SpeculativeConfig.max_num_new_slots_for_drafting (DFlash K; with parallel_drafting K for a draft model, K - 1
    # otherwise; else 1 for a draft model).
    "budget_rule": "num_lookahead_tokens",
    # vllm/config/cache.py CacheConfig.gpu_memory_utilization: 0.92; None in 0.34, which resolves to 1.0 with the
    # extensible KV cache (the default on CUDA: a cap, the KV cache sized from the memory free after warm-up;
    # `resolved_gpu_memory_utilization`, vllm/v1/worker/utils.py request_memory).
    "gpu_memory_utilization": 0.92,
}
_VALUE_CHANGES = {
    "0.32.0": {"budget_rule": "max_num_new_slots_for_drafting"},
    "0.34.0": {"custom_methods": True, "v1_runner": False, "gpu_memory_utilization": None},
}


def _number(text):
    """(major, minor) of a version text, or None."""
    try:
        parts = [int(part) for part in str(text).split(".")[:2]]
    except ValueError:
        return None
    return tuple(parts + [0])[:2] if parts else None


def version(environ):
    """The release modelled: SIMVLLM_VERSION, else DEFAULT_VERSION (`vllm --version`, /version, package metadata)."""
    text = environ.get("SIMVLLM_VERSION") or DEFAULT_VERSION
    return text if _number(text) else DEFAULT_VERSION


def is_legacy(environ):
    """Whether the release modelled is older than the oldest read from a wheel (the LEGACY test device)."""
    return _number(version(environ)) < _number(VERSIONS[0])


def release(environ):
    """The release of VERSIONS whose tables apply: the newest not newer than the one modelled (the oldest below it)."""
    number = _number(version(environ))
    older = [known for known in VERSIONS if _number(known) <= number]
    return older[-1] if older else VERSIONS[0]


class Release:
    """The facts of one release: the speculative-config sets fields (every field), set_by_vllm (fields vLLM fills
    itself and refuses as input), mtp_methods, methods_with_drafter, methods_without_drafter, methods; and the values
    custom_methods, v1_runner, budget_rule, gpu_memory_utilization (its default; None: the extensible KV cache)."""

    def __init__(self, name):
        base = {
            "fields": _FIELDS,
            "set_by_vllm": set(),
            "mtp_methods": _MTP_METHODS,
            "methods_with_drafter": _METHODS_WITH_DRAFTER,
            "methods_without_drafter": _METHODS_WITHOUT_DRAFTER,
        }
        for key, value in base.items():
            added, removed = _SPECULATIVE_CHANGES.get(name, {}).get(key, (set(), set()))
            setattr(self, key, frozenset((value - removed) | added))
        self.__dict__.update(_VALUES, **_VALUE_CHANGES.get(name, {}))
        self.version = name
        self.methods = self.mtp_methods | self.methods_with_drafter | self.methods_without_drafter


def facts_of(environ):
    """The Release facts of the release modelled in `environ`."""
    return Release(release(environ))


# The facts below are the same in 0.32.0, 0.33.0 and 0.34.0.
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
