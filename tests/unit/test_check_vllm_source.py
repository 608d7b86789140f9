"""scripts/check_vllm_source.py against a small synthetic wheel written in the shapes of vllm 0.33.0's sources.

The synthetic wheel is generated from the collection's own tables, so it agrees with them; each test then changes
one fact in it, as a new vLLM release would, and the check must name that fact. (The real wheel is checked by
`make check-vllm-source`, which needs the network once.)
"""

from __future__ import annotations

import importlib.util
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("check_vllm_source", REPO / "scripts" / "check_vllm_source.py")
check_vllm_source = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(check_vllm_source)
TABLES = check_vllm_source.load_tables()


def literal(values):
    return "Literal[%s]" % ", ".join(repr(value) for value in values)


def sources():
    """{path in the wheel: source} agreeing with the tables."""
    validator, parse, simulator, simspec, _product = TABLES
    import simvllm

    mtp = sorted(simspec.MTP_METHODS)
    others = [m for m in validator.VLLM_METHODS if m not in mtp]
    fields = []
    for name in sorted(simspec.FIELDS):
        kind = parse._FIELD_KINDS.get(name)
        if kind == "positive_int":
            fields.append("    %s: int | None = Field(default=None, ge=1)" % name)
        elif kind == "bool":
            fields.append("    %s: bool = False" % name)
        else:
            fields.append("    %s: str | None = None" % name)
    markers = "\n".join(
        '        elif %r in self.draft_model_config.model.lower():\n            self.method = %r' % pair
        for pair in validator.INFERRED_BY_NAME
    )
    speculative = (
        "MTPModelTypes = %s\nSpeculativeMethod = Literal[%s, MTPModelTypes]\nDraftSampleMethod = %s\n\n"
        "class SpeculativeConfig:\n%s\n    target_model_config: SkipValidation[ModelConfig] = None\n\n"
        "    def __post_init__(self):\n        if self.method is not None:\n            pass\n%s\n\n"
        "    def _verify_args(self):\n        if self.tensor_parallel_size is not None:\n"
        "            raise ValueError(\"'tensor_parallel_size' is not a valid argument in the speculative_config.\")\n"
        % (
            literal(mtp),
            ", ".join(repr(m) for m in others),
            literal(validator.DRAFT_SAMPLE_METHODS),
            "\n".join(fields),
            markers,
        )
    )
    branches = "".join(
        "        %s:\n            default_max_num_batched_tokens = {UsageContext.LLM_CLASS: 1, UsageContext.OPENAI_API_SERVER: %d}\n"
        "            default_max_num_seqs = {UsageContext.LLM_CLASS: 1, UsageContext.OPENAI_API_SERVER: %d}\n"
        % ("if a" if index == 0 else "else" if index == 2 else "elif b", tokens, seqs)
        for index, (_label, tokens, seqs) in enumerate(reversed(validator.BATCH_DEFAULTS))
    )
    parts = "\n".join('    if x:\n        process_name += f"_%s{rank}"' % part for part in simulator.WORKER_TITLE_PARTS)
    return {
        "vllm/config/speculative.py": speculative,
        "vllm/engine/arg_utils.py": "class EngineArgs:\n    shutdown_timeout: int = %d\n\n"
        "    def get_batch_defaults(cls, world_size):\n%s" % (simulator.SHUTDOWN_TIMEOUT_DEFAULT, branches),
        "vllm/config/vllm.py": "class VllmConfig:\n    shutdown_timeout: int = Field(default=%d, ge=0)\n"
        % simulator.SHUTDOWN_TIMEOUT_DEFAULT,
        "vllm/envs.py": "environment_variables = {\n"
        "    'VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS': lambda: int(os.getenv('VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS', '%d')),\n"
        "    'VLLM_PROCESS_NAME_PREFIX': lambda: os.getenv('VLLM_PROCESS_NAME_PREFIX', %r),\n}\n"
        % (simulator.WORKER_SHUTDOWN_TIMEOUT_DEFAULT, simulator.PROCESS_NAME_PREFIX),
        "vllm/v1/utils.py": "def shutdown(procs, timeout=None):\n    if timeout is None:\n        timeout = %r\n\n"
        "def run_api_server_worker_proc(index):\n    set_process_title(%r, str(index))\n"
        % (simulator.BEST_EFFORT_WINDOW, simulator.API_SERVER_TITLE.rstrip("_")),
        "vllm/v1/executor/multiproc_executor.py": "def _ensure_worker_termination():\n    wait_for_termination(active_procs(), %d)\n\n"
        "def setup_proc_title_and_log_prefix(enable_ep):\n    process_name = %r\n%s\n"
        % (simulator.WORKER_SIGTERM_WAIT, simulator.WORKER_TITLE, parts),
        "vllm/v1/engine/core.py": "def run_engine_core(dp_rank=0):\n    if dp:\n        process_title = f\"%s{dp_rank}\"\n"
        "    else:\n        process_title = %r\n" % (simulator.ENGINE_CORE_DP_TITLE, simulator.ENGINE_CORE_TITLE),
        "vllm/v1/engine/coordinator.py": "def run():\n    set_process_title(%r)\n" % simulator.DP_COORDINATOR_TITLE,
        "vllm/config/cache.py": "class CacheConfig:\n    gpu_memory_utilization: float = Field(default=%r, gt=0, le=1)\n"
        % simulator.GPU_MEMORY_UTILIZATION_DEFAULT,
        "vllm/v1/metrics/loggers.py": "labelnames = %r\n%s\n"
        % (
            list(simulator.METRIC_LABELS),
            "\n".join(
                "m = self._%s_cls(name=%r, documentation='')" % (kind, name) for name, kind in simulator.METRICS.items()
            ),
        ),
        "vllm/v1/spec_decode/metrics.py": "counter_specs = [('vllm:spec_decode_num_drafts', 'd')]\n",
        "vllm/config/model.py": "def get_served_model_name(model, served_model_name):\n"
        "    if isinstance(served_model_name, list):\n        return served_model_name[0]\n",
        "vllm/_version.py": "__version__ = version = %r\n" % simvllm.__version__,
    }


def problems(tmp_path, **changes):
    """The check's problems against the synthetic wheel, with `changes` {path: (old, new)} applied."""
    files = sources()
    for path, (old, new) in changes.items():
        key = "vllm/%s" % path.replace("__", "/").replace("_py", ".py")
        assert old in files[key], (key, old)
        files[key] = files[key].replace(old, new)
    wheel = tmp_path / "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return check_vllm_source.check(check_vllm_source.Wheel(str(wheel)), TABLES).problems


def test_a_wheel_that_agrees_with_the_tables_passes(tmp_path):
    assert problems(tmp_path) == []


@pytest.mark.parametrize(
    "path, old, new, named",
    [
        ("config__speculative_py", "'ngram', ", "'ngram', 'medusa', ", "validator VLLM_METHODS"),
        ("config__speculative_py", "'deepseek_mtp', ", "'deepseek_mtp', 'newmodel_mtp', ", "simulator MTP_METHODS"),
        (
            "config__speculative_py",
            "    model: str | None = None\n",
            "    model: str | None = None\n    tree: bool = False\n",
            "simulator FIELDS (vllm/config/speculative.py SpeculativeConfig fields): missing: tree",
        ),
        ("config__speculative_py", "'probabilistic'", "'probabilistic', 'typical'", "DRAFT_SAMPLE_METHODS"),
        ("envs_py", "'5'", "'7'", "simulator WORKER_SHUTDOWN_TIMEOUT_DEFAULT"),
        ("engine__arg_utils_py", "shutdown_timeout: int = 0", "shutdown_timeout: int = 3", "SHUTDOWN_TIMEOUT_DEFAULT"),
        ("v1__executor__multiproc_executor_py", '"_PCP', '"_CP', "simulator WORKER_TITLE_PARTS"),
        (
            "v1__metrics__loggers_py",
            "'vllm:num_requests_running'",
            "'vllm:num_requests_running_now'",
            "_vllm_api RUNNING",
        ),
        ("config__model_py", "served_model_name[0]", "served_model_name[-1]", "METRIC_MODEL_NAME"),
    ],
)
def test_a_changed_fact_is_named(tmp_path, path, old, new, named):
    found = problems(tmp_path, **{path: (old, new)})
    assert found and any(named in problem for problem in found), found


def test_a_source_that_changed_shape_is_reported_not_passed(tmp_path):
    with pytest.raises(LookupError):
        problems(tmp_path, v1__utils_py=("if timeout is None:", "if not timeout:"))
