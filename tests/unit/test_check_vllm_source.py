"""scripts/check_vllm_source.py against small synthetic wheels written in the shapes of the vllm wheels' sources.

A synthetic wheel is generated from the collection's own tables of one release, so it agrees with them; each test
then changes one fact in it, as a new vLLM release would, and the check must name that fact. (The real wheels are
checked by `make check-vllm-source`, which needs the network once.)
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


def _field_lines(version):
    validator, simulated = TABLES.validator.facts(version), TABLES.simulator.Release(version)
    lines = []
    for name in sorted(simulated.fields):
        kind = TABLES.parse._FIELD_KINDS.get(name)
        if kind == "positive_int":
            lines.append("    %s: int | None = Field(default=None, ge=1)" % name)
        elif kind == "bool":
            lines.append("    %s: bool = False" % name)
        elif name == "method":
            lines.append(
                "    method: SpeculativeMethod%s | None = None" % (" | str" if validator.custom_methods else "")
            )
        else:
            lines.append("    %s: str | None = None" % name)
        if name in validator.no_effect_fields:
            lines.append('    """Deprecated and has no effect."""')
    lines += ["    %s: str | None = field(default=None, init=False)" % name for name in sorted(simulated.set_by_vllm)]
    return "\n".join(lines)


def speculative_source(version):
    """vllm/config/speculative.py of a release, and 0.34's speculator configs when the inference moved there."""
    validator, simulated = TABLES.validator.facts(version), TABLES.simulator.Release(version)
    mtp = sorted(simulated.mtp_methods)
    others = [m for m in validator.methods if m not in mtp]
    in_post_init = validator.inferred_at.startswith("vllm/config/speculative.py")
    markers = "\n".join(
        "        elif %r in self.draft_model_config.model.lower():\n            self.method = %r" % pair
        for pair in (validator.inferred_by_name if in_post_init else ())
    )
    files = {
        "vllm/config/speculative.py": "MTPModelTypes = %s\nSpeculativeMethod = Literal[%s, MTPModelTypes]\n"
        "DraftSampleMethod = %s\n\nclass SpeculativeConfig:\n%s\n"
        "    target_model_config: SkipValidation[ModelConfig] = None\n\n"
        "    def __post_init__(self):\n        if self.method is not None:\n            pass\n%s\n\n"
        "    def _verify_args(self):\n        if self.tensor_parallel_size is not None:\n"
        "            raise ValueError(\"'tensor_parallel_size' is not a valid argument in the speculative_config.\")\n"
        % (
            literal(mtp),
            ", ".join(repr(m) for m in others),
            literal(validator.draft_sample_methods),
            _field_lines(version),
            markers,
        )
    }
    if not in_post_init:
        order = [method for _marker, method in validator.inferred_by_name]
        files["vllm/v1/worker/gpu/spec_decode/speculator_config.py"] = (
            "_CONFIG_BY_METHOD: dict[str, str] = {%s}\n_CHECKPOINT_DETECTION_ORDER = %r\n"
            % (", ".join("%r: _builtin('%s.config', 'C%s')" % (m, m, m) for m in order), tuple(order + ["mtp"]))
        )
        for marker, method in validator.inferred_by_name:
            files["vllm/v1/worker/gpu/spec_decode/%s/config.py" % method] = (
                "class C%s:\n    def matches(cls, spec):\n        return %r in spec.draft_model_config.model.lower()\n"
                % (method, marker)
            )
    return files


def budget_source(version):
    validator = TABLES.validator.facts(version)
    if validator.budget_rule == "num_lookahead_tokens":
        compared = "self.num_lookahead_tokens"
    else:
        compared = "scheduled_token_delta"
    active = "        self.scheduler_config.max_num_active_seqs = 1\n" if validator.dflash_active_seqs else ""
    return (
        "class VllmConfig:\n    shutdown_timeout: int = Field(default=%d, ge=0)\n\n"
        "    def _set_max_num_scheduled_tokens(self):\n"
        "        scheduled_token_delta = self.speculative_config.max_num_new_slots_for_drafting\n"
        "        if max_num_batched_tokens <= %s:\n            raise ValueError('no slots')\n%s"
        % (TABLES.simulator.SHUTDOWN_TIMEOUT_DEFAULT, compared, active)
    )


def arg_source(version):
    """vllm/engine/arg_utils.py: the shutdown default, the batch defaults and every flag the role refuses."""
    validator, simulator = TABLES.validator.facts(version), TABLES.simulator
    branches = "".join(
        "        %s:\n            default_max_num_batched_tokens = {UsageContext.LLM_CLASS: 1, "
        "UsageContext.OPENAI_API_SERVER: %d}\n"
        "            default_max_num_seqs = {UsageContext.LLM_CLASS: 1, UsageContext.OPENAI_API_SERVER: %d}\n"
        % ("if a" if index == 0 else "else" if index == 2 else "elif b", tokens, seqs)
        for index, (_label, tokens, seqs) in enumerate(reversed(validator.batch_defaults))
    )
    checks = TABLES.checks
    flags = sorted(
        set(checks.OWNED) | set(checks.SECRETS) | {checks.API_SERVER_COUNT, "--config", "--disable-log-stats"}
    )
    return (
        "class EngineArgs:\n    shutdown_timeout: int = %d\n\n"
        "    def get_batch_defaults(cls, world_size):\n%s\n"
        "    def add_cli_args(parser):\n%s"
        % (
            simulator.SHUTDOWN_TIMEOUT_DEFAULT,
            branches,
            "".join("        parser.add_argument(%r)\n" % flag for flag in flags),
        )
    )


def sources(version="0.33.0"):
    """{path in the wheel: source} agreeing with the tables of `version`."""
    simulator = TABLES.simulator
    v1 = TABLES.validator.facts(version).v1_runner
    parts = "\n".join('    if x:\n        process_name += f"_%s{rank}"' % part for part in simulator.WORKER_TITLE_PARTS)
    files = speculative_source(version)
    files.update(
        {
            "vllm/engine/arg_utils.py": arg_source(version),
            "vllm/config/vllm.py": budget_source(version),
            "vllm/utils/argparse_utils.py": "def parse_args():\n    pass\n",
            "vllm/envs.py": "environment_variables = {\n"
            "    'VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS': lambda: int(os.getenv('VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS', '%d')),\n"
            "    'VLLM_PROCESS_NAME_PREFIX': lambda: os.getenv('VLLM_PROCESS_NAME_PREFIX', %r),\n%s}\n"
            % (
                simulator.WORKER_SHUTDOWN_TIMEOUT_DEFAULT,
                simulator.PROCESS_NAME_PREFIX,
                "    'VLLM_USE_V2_MODEL_RUNNER': lambda: os.getenv('VLLM_USE_V2_MODEL_RUNNER', None),\n" if v1 else "",
            ),
            "vllm/v1/utils.py": "def shutdown(procs, timeout=None):\n    if timeout is None:\n        timeout = %r\n\n"
            "def run_api_server_worker_proc(index):\n    set_process_title(%r, str(index))\n"
            % (simulator.BEST_EFFORT_WINDOW, simulator.API_SERVER_TITLE.rstrip("_")),
            "vllm/v1/executor/multiproc_executor.py": "def _ensure_worker_termination():\n"
            "    wait_for_termination(active_procs(), %d)\n\n"
            "def setup_proc_title_and_log_prefix(enable_ep):\n    process_name = %r\n%s\n"
            % (simulator.WORKER_SIGTERM_WAIT, simulator.WORKER_TITLE, parts),
            "vllm/v1/engine/core.py": "def run_engine_core(dp_rank=0):\n    if dp:\n"
            "        process_title = f\"%s{dp_rank}\"\n    else:\n        process_title = %r\n"
            % (simulator.ENGINE_CORE_DP_TITLE, simulator.ENGINE_CORE_TITLE),
            "vllm/v1/engine/coordinator.py": "def run():\n    set_process_title(%r)\n" % simulator.DP_COORDINATOR_TITLE,
            "vllm/config/cache.py": "class CacheConfig:\n    gpu_memory_utilization: float = Field(default=%r, gt=0, le=1)\n"
            % simulator.Release(version).gpu_memory_utilization,
            "vllm/v1/metrics/loggers.py": "labelnames = %r\n%s\n"
            % (
                list(simulator.METRIC_LABELS),
                "\n".join(
                    "m = self._%s_cls(name=%r, documentation='')" % (kind, name)
                    for name, kind in simulator.METRICS.items()
                ),
            ),
            "vllm/v1/spec_decode/metrics.py": "counter_specs = [('vllm:spec_decode_num_drafts', 'd')]\n",
            "vllm/config/model.py": "def get_served_model_name(model, served_model_name):\n"
            "    if isinstance(served_model_name, list):\n        return served_model_name[0]\n",
            "vllm/_version.py": "__version__ = version = %r\n" % version,
        }
    )
    return files


def write_wheel(tmp_path, version="0.33.0", **changes):
    """A synthetic wheel of `version`, with `changes` {path: (old, new)} applied; returns its path."""
    files = sources(version)
    for path, (old, new) in changes.items():
        key = "vllm/%s" % path.replace("__", "/").replace("_py", ".py")
        assert old in files[key], (key, old)
        files[key] = files[key].replace(old, new)
    wheel = tmp_path / ("vllm-%s-cp38-abi3-manylinux_2_28_x86_64.whl" % version)
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
    return wheel


def problems(tmp_path, version="0.33.0", **changes):
    """The check's problems against the synthetic wheel of `version`, with `changes` applied."""
    wheel = write_wheel(tmp_path, version, **changes)
    return check_vllm_source.check(check_vllm_source.Wheel(str(wheel)), TABLES).problems


@pytest.mark.parametrize("version", ["0.32.0", "0.33.0", "0.34.0"])
def test_a_wheel_that_agrees_with_the_tables_of_its_release_passes(tmp_path, version):
    assert problems(tmp_path, version) == []


@pytest.mark.parametrize(
    "path, old, new, named",
    [
        ("config__speculative_py", "'ngram', ", "'ngram', 'medusa', ", "validator methods"),
        ("config__speculative_py", "'deepseek_mtp', ", "'deepseek_mtp', 'newmodel_mtp', ", "simulator mtp_methods"),
        (
            "config__speculative_py",
            "    model: str | None = None\n",
            "    model: str | None = None\n    tree: bool = False\n",
            "simulator fields (vllm/config/speculative.py SpeculativeConfig fields): missing: tree",
        ),
        ("config__speculative_py", "'probabilistic'", "'probabilistic', 'typical'", "draft_sample_methods"),
        ("envs_py", "'5'", "'7'", "simulator WORKER_SHUTDOWN_TIMEOUT_DEFAULT"),
        ("envs_py", "'5'", "'7'", "_vllm_server_facts worker_shutdown_default"),
        ("engine__arg_utils_py", "shutdown_timeout: int = 0", "shutdown_timeout: int = 3", "SHUTDOWN_TIMEOUT_DEFAULT"),
        ("engine__arg_utils_py", "shutdown_timeout: int = 0", "shutdown_timeout: int = 3", "shutdown_timeout_default"),
        ("v1__executor__multiproc_executor_py", '"_PCP', '"_CP', "simulator WORKER_TITLE_PARTS"),
        (
            "v1__metrics__loggers_py",
            "'vllm:num_requests_running'",
            "'vllm:num_requests_running_now'",
            "_metrics_text RUNNING",
        ),
        ("config__model_py", "served_model_name[0]", "served_model_name[-1]", "METRIC_MODEL_NAME"),
        # vLLM 0.34's changes, as a 0.33 wheel would show them
        (
            "config__speculative_py",
            "method: SpeculativeMethod |",
            "method: SpeculativeMethod | str |",
            "custom_methods",
        ),
        (
            "config__speculative_py",
            "    model: str | None = None\n",
            "    model: str | None = None\n    custom_method: str | None = field(default=None, init=False)\n",
            "simulator set_by_vllm",
        ),
        (
            "config__speculative_py",
            "    parallel_drafting: bool = False\n",
            '    parallel_drafting: bool = False\n    """Deprecated and has no effect."""\n',
            "validator no_effect_fields",
        ),
        ("envs_py", "    'VLLM_USE_V2_MODEL_RUNNER'", "    'VLLM_NO_SUCH'", "validator v1_runner"),
        ("config__speculative_py", "elif 'dflash' in", "elif 'dflash-' in", "validator inferred_by_name"),
        ("config__cache_py", "default=0.92", "default=None", "simulator gpu_memory_utilization (0.33.0)"),
        ("config__vllm_py", "<= self.num_lookahead_tokens", "<= scheduled_token_delta", "validator budget_rule"),
        ("engine__arg_utils_py", "        parser.add_argument('--spec-model')\n", "", "--spec-model"),
    ],
)
def test_a_changed_fact_is_named(tmp_path, path, old, new, named):
    found = problems(tmp_path, **{path: (old, new)})
    assert found and any(named in problem for problem in found), found


def test_the_inference_moved_in_0_34_is_read_where_it_went(tmp_path):
    """0.34 has no name markers in __post_init__: they are read from the speculator configs' matches()."""
    assert problems(tmp_path, "0.34.0") == []
    found = problems(
        tmp_path, "0.34.0", v1__worker__gpu__spec_decode__dflash__config_py=("'dflash' in", "'dflash2' in")
    )
    assert any("validator inferred_by_name" in problem and "speculator_config.py" in problem for problem in found), (
        found
    )


def test_each_release_is_checked_against_its_own_tables(tmp_path):
    """A 0.33 wheel labelled 0.34.0 disagrees with 0.34.0's tables on exactly what 0.34 changed."""
    wheel = write_wheel(tmp_path, "0.33.0", _version_py=("'0.33.0'", "'0.34.0'"))
    found = check_vllm_source.check(check_vllm_source.Wheel(str(wheel)), TABLES).problems
    assert any("validator fields" in p and "custom" not in p and "speculator_options" in p for p in found), found
    assert any("validator v1_runner" in p for p in found), found


def test_a_release_without_tables_is_named(tmp_path):
    found = problems(tmp_path, _version_py=("'0.33.0'", "'0.35.0'"))
    assert len(found) == 1 and "a known release" in found[0] and "0.35.0" in found[0], found


def test_a_release_missing_from_one_list_names_the_file_to_change(tmp_path, monkeypatch):
    monkeypatch.setattr(TABLES.simulator, "VERSIONS", ("0.32.0", "0.33.0"))
    found = problems(tmp_path, _version_py=("'0.33.0'", "'0.34.0'"))
    assert found == [
        "vllm 0.34.0 (vllm/_version.py) is not a known release: add it to VERSIONS in tests/sim/simvllm/facts.py "
        '(CONTRIBUTING.md, "Adding a vLLM release")'
    ], found
    found = problems(tmp_path, _version_py=("'0.33.0'", "'0.35.0'"))
    assert "add it to VERSIONS and Release in plugins/module_utils/vllm/_vllm_versions.py; " in found[0], found


def test_the_files_to_change_are_named_after_the_problems(tmp_path, capsys):
    wheel = write_wheel(tmp_path, "0.32.0", envs_py=("'5'", "'7'"))
    assert check_vllm_source.check_wheel(str(wheel), TABLES) == 2
    out = capsys.readouterr().out
    assert (
        "to change: tests/sim/simvllm/facts.py\nto change: plugins/module_utils/vllm/_vllm_server_facts.py\n" in out
    ), out
    assert out.count("to change: ") == 2, out


def test_main_checks_every_release_and_fails_on_one(tmp_path, capsys, monkeypatch):
    cache = tmp_path / "wheels"
    cache.mkdir()
    for version in TABLES.versions.VERSIONS:
        directory = tmp_path / version
        directory.mkdir()
        changes = {"envs_py": ("'5'", "'7'")} if version == "0.32.0" else {}
        write_wheel(directory, version, **changes).rename(
            cache / ("vllm-%s-cp38-abi3-manylinux_2_28_x86_64.whl" % version)
        )
    assert check_vllm_source.main(["--cache", str(cache)]) == 1
    out = capsys.readouterr().out
    assert out.count("sha256: ") == 3 and "3 release(s) checked: 2 fact(s) wrong" in out, out
    assert "checked against vllm 0.34.0: all agree" in out and "checked against vllm 0.32.0: 2 wrong" in out, out
    assert check_vllm_source.main(["--cache", str(cache), "--version", "0.34.0"]) == 0


def test_a_source_that_changed_shape_is_reported_not_passed(tmp_path):
    with pytest.raises(LookupError):
        problems(tmp_path, v1__utils_py=("if timeout is None:", "if not timeout:"))
