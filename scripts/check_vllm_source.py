#!/usr/bin/env python
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Compare the collection's vLLM tables with the vLLM wheel they were read from (`make check-vllm-source`).

Two tables describe vLLM 0.33: the validator's (plugins/module_utils/_speculative_vllm.py and
_speculative_parse.py) and the simulator's (tests/sim/simvllm/). Both were written by reading the wheel;
this script reads the wheel again, with `ast` (the wheel is never installed or imported), and fails
naming every speculative-config field, method, MTP name, metric name, process title or default that
either table, or the product's metric names (plugins/module_utils/_vllm_api.py), gets wrong.

Usage: scripts/check_vllm_source.py [--version 0.33.0] [--wheel PATH] [--cache DIR]
The wheel is downloaded once with `pip download --no-deps vllm==VERSION` into the cache directory
(default: $GPUOPS_WHEEL_CACHE, else ~/.cache/gpuops-nvidia/wheels). Exit status 0 when every fact
agrees, 1 when one does not, 2 when the wheel cannot be had.
"""

from __future__ import annotations

import argparse
import ast
import glob
import hashlib
import os
import subprocess
import sys
import traceback
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- the wheel


def fetch_wheel(version, cache):
    """Path of the vllm==version wheel in `cache`, downloaded with pip when it is not there yet."""
    pattern = os.path.join(cache, "vllm-%s-*.whl" % version)
    found = sorted(glob.glob(pattern))
    if not found:
        os.makedirs(cache, exist_ok=True)
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "vllm==%s" % version,
            "-d",
            cache,
        ]
        print("downloading: %s" % " ".join(command), flush=True)
        subprocess.run(command, check=False)
        found = sorted(glob.glob(pattern))
    if not found:
        raise SystemExit("cannot get the vllm %s wheel into %s (pip download failed)" % (version, cache))
    return found[-1]


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Wheel:
    """The wheel's Python sources, parsed on demand."""

    def __init__(self, path):
        self.zip = zipfile.ZipFile(path)
        self.trees = {}

    def tree(self, name):
        if name not in self.trees:
            self.trees[name] = ast.parse(self.zip.read(name).decode("utf-8"), name)
        return self.trees[name]


def find(tree, kind, name):
    """The first node of `kind` (ast.ClassDef, ast.FunctionDef) called `name` anywhere in `tree`."""
    for node in ast.walk(tree):
        if isinstance(node, kind) and node.name == name:
            return node
    raise LookupError("no %s %s" % (kind.__name__, name))


def module_assign(tree, name):
    """The value node of the module-level `name = ...`."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    raise LookupError("no module-level %s" % name)


def literal_values(tree, node):
    """Every string of a `Literal[...]` alias, following aliases defined in the same module."""
    if isinstance(node, ast.Subscript):
        inner = node.slice
        items = inner.elts if isinstance(inner, ast.Tuple) else [inner]
        values = []
        for item in items:
            values.extend(literal_values(tree, item))
        return values
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name):
        return literal_values(tree, module_assign(tree, node.id))
    raise LookupError("not a Literal: %s" % ast.dump(node)[:80])


def strings_in(node):
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def fstring_prefixes(node):
    """The constant first part of every f-string under `node`, in source order."""
    found = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.JoinedStr) and sub.values and isinstance(sub.values[0], ast.Constant):
            found.append((sub.lineno, sub.values[0].value))
    return [text for _line, text in sorted(found)]


def call_kw(call, name):
    for keyword in call.keywords:
        if keyword.arg == name:
            return keyword.value
    return None


# ---------------------------------------------------------------- facts read from the wheel

SPECULATIVE = "vllm/config/speculative.py"


def speculative_fields(wheel):
    """{field: (annotation source, Field keyword dict)} of SpeculativeConfig that a user may set."""
    tree = wheel.tree(SPECULATIVE)
    fields = {}
    for node in find(tree, ast.ClassDef, "SpeculativeConfig").body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        annotation = ast.unparse(node.annotation)
        if annotation.startswith("SkipValidation"):
            continue  # filled by the engine (target_model_config & co.)
        bounds = {}
        if isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "Field":
            bounds = dict(
                (k.arg, ast.literal_eval(k.value)) for k in node.value.keywords if k.arg in ("gt", "ge", "le", "lt")
            )
        fields[node.target.id] = (annotation, bounds)
    return fields


def speculative_literal(wheel, name):
    tree = wheel.tree(SPECULATIVE)
    return literal_values(tree, module_assign(tree, name))


def verify_args_refuses(wheel):
    """Field names that SpeculativeConfig._verify_args refuses outright ("'X' is not a valid argument")."""
    body = find(wheel.tree(SPECULATIVE), ast.FunctionDef, "_verify_args")
    refused = []
    for text in strings_in(body):
        if "is not a valid argument" in text and text.startswith("'"):
            refused.append(text.split("'")[1])
    return refused


def inferred_by_name(wheel):
    """(marker, method) pairs of __post_init__: `elif "marker" in <draft model>.lower(): self.method = "method"`."""
    body = find(wheel.tree(SPECULATIVE), ast.FunctionDef, "__post_init__")
    pairs = []
    for node in ast.walk(body):
        if not isinstance(node, ast.If):
            continue
        compare = node.test.values[0] if isinstance(node.test, ast.BoolOp) else node.test
        if not (
            isinstance(compare, ast.Compare)
            and isinstance(compare.ops[0], ast.In)
            and isinstance(compare.left, ast.Constant)
            and ast.unparse(compare.comparators[0]).endswith(".lower()")
        ):
            continue
        assign = node.body[0]
        if isinstance(assign, ast.Assign) and ast.unparse(assign.targets[0]) == "self.method":
            pairs.append((compare.left.value, assign.value.value))
    return pairs


def batch_defaults(wheel):
    """[(max_num_batched_tokens, max_num_seqs)] for the API server, in get_batch_defaults' branch order."""
    body = find(wheel.tree("vllm/engine/arg_utils.py"), ast.FunctionDef, "get_batch_defaults")
    values = {"default_max_num_batched_tokens": [], "default_max_num_seqs": []}
    for node in ast.walk(body):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict):
            target = ast.unparse(node.targets[0])
            for key, value in zip(node.value.keys, node.value.values):
                if (
                    target in values
                    and ast.unparse(key).endswith("OPENAI_API_SERVER")
                    and isinstance(value, ast.Constant)
                ):
                    values[target].append((node.lineno, value.value))
    tokens = [v for _l, v in sorted(values["default_max_num_batched_tokens"])]
    seqs = [v for _l, v in sorted(values["default_max_num_seqs"])]
    return list(zip(tokens, seqs))[:3]  # the GPU branches; the TPU ones follow


def class_default(wheel, path, class_name, field):
    for node in find(wheel.tree(path), ast.ClassDef, class_name).body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == field:
            value = node.value
            if isinstance(value, ast.Call):
                value = call_kw(value, "default")
            return ast.literal_eval(value)
    raise LookupError("no %s.%s in %s" % (class_name, field, path))


def env_default(wheel, name):
    """Default of an environment variable of vllm/envs.py (the os.getenv fallback in its lambda)."""
    tree = wheel.tree("vllm/envs.py")
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == name:
                    for call in ast.walk(value):
                        if isinstance(call, ast.Call) and ast.unparse(call.func) == "os.getenv" and len(call.args) == 2:
                            return ast.literal_eval(call.args[1])
    raise LookupError("no default for %s in vllm/envs.py" % name)


def best_effort_window(wheel):
    """vllm/v1/utils.py shutdown(): `if timeout is None: timeout = <seconds>`."""
    body = find(wheel.tree("vllm/v1/utils.py"), ast.FunctionDef, "shutdown")
    for node in ast.walk(body):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "timeout is None":
            return node.body[0].value.value
    raise LookupError("no best-effort window in vllm/v1/utils.py shutdown")


def worker_second_wait(wheel):
    """multiproc_executor.py: seconds between the workers' SIGTERM and SIGKILL (`wait_for_termination(..., N)`)."""
    tree = wheel.tree("vllm/v1/executor/multiproc_executor.py")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) == "wait_for_termination"
            and len(node.args) == 2
            and isinstance(node.args[1], ast.Constant)
        ):
            return node.args[1].value
    raise LookupError("no wait_for_termination(..., N) in multiproc_executor.py")


def worker_title_parts(wheel):
    """("Worker", ["DP", "PP", ...]): the worker title's base and suffixes in order (setup_proc_title_and_log_prefix)."""
    body = find(
        wheel.tree("vllm/v1/executor/multiproc_executor.py"), ast.FunctionDef, "setup_proc_title_and_log_prefix"
    )
    base = None
    for node in ast.walk(body):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "process_name":
            base = node.value.value
    return base, [prefix.lstrip("_") for prefix in fstring_prefixes(body)]


def titles(wheel):
    """Process titles of the other vLLM processes (names given to set_process_title)."""
    engine = find(wheel.tree("vllm/v1/engine/core.py"), ast.FunctionDef, "run_engine_core")
    found = {"engine_core": None, "engine_core_dp": None}
    for node in ast.walk(engine):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "process_title":
            if isinstance(node.value, ast.Constant):
                found["engine_core"] = node.value.value
            elif isinstance(node.value, ast.JoinedStr):
                found["engine_core_dp"] = node.value.values[0].value
    for path, key in (("vllm/v1/engine/coordinator.py", "dp_coordinator"), ("vllm/v1/utils.py", "api_server")):
        for node in ast.walk(wheel.tree(path)):
            if (
                isinstance(node, ast.Call)
                and ast.unparse(node.func) == "set_process_title"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found[key] = node.args[0].value
                if key == "api_server":
                    found["api_server_indexed"] = len(node.args) > 1  # set_process_title(name, suffix): name_suffix
    return found


def metric_types(wheel):
    """{metric name: "gauge" | "counter" | ...} created by the stat loggers."""
    types = {}
    loggers = wheel.tree("vllm/v1/metrics/loggers.py")
    for node in ast.walk(loggers):
        if isinstance(node, ast.Call):
            name = call_kw(node, "name")
            func = ast.unparse(node.func)
            if isinstance(name, ast.Constant) and str(name.value).startswith("vllm:"):
                types[name.value] = func.rsplit("_", 2)[-2] if func.endswith("_cls") else func.lower()
    spec = wheel.tree("vllm/v1/spec_decode/metrics.py")
    for node in ast.walk(spec):
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "counter_specs":
            for item in node.value.elts:
                types[item.elts[0].value] = "counter"
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("_counter_cls"):
            name = call_kw(node, "name")
            if isinstance(name, ast.Constant):
                types[name.value] = "counter"
    return types


def metric_labels(wheel):
    """The label names of the per-engine stat metrics (PrometheusStatLogger: labelnames = [...])."""
    for node in ast.walk(wheel.tree("vllm/v1/metrics/loggers.py")):
        if (
            isinstance(node, ast.Assign)
            and ast.unparse(node.targets[0]) == "labelnames"
            and isinstance(node.value, ast.List)
        ):
            return [item.value for item in node.value.elts]
    raise LookupError("no labelnames in loggers.py")


def served_name_rule(wheel):
    """'first' when get_served_model_name returns served_model_name[0] for a list."""
    body = find(wheel.tree("vllm/config/model.py"), ast.FunctionDef, "get_served_model_name")
    for node in ast.walk(body):
        if isinstance(node, ast.Return) and ast.unparse(node.value) == "served_model_name[0]":
            return "first"
    return "unknown"


# ---------------------------------------------------------------- the collection's tables


def load_tables():
    """The validator's, the simulator's and the product's tables, imported from this checkout."""
    collections = os.path.join(REPO, ".collections")
    link = os.path.join(collections, "ansible_collections", "gpuops", "nvidia")
    if not os.path.isdir(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink("../../..", link)
    sys.path[:0] = [collections, os.path.join(REPO, "tests", "sim")]
    from ansible_collections.gpuops.nvidia.plugins.module_utils import _speculative_parse as parse
    from ansible_collections.gpuops.nvidia.plugins.module_utils import _speculative_vllm as validator
    from ansible_collections.gpuops.nvidia.plugins.module_utils import _vllm_api as product
    from simvllm import facts as simulator
    from simvllm import specdecode as simspec

    return validator, parse, simulator, simspec, product


# ---------------------------------------------------------------- the comparison


class Report:
    def __init__(self):
        self.problems = []
        self.checked = 0

    def same(self, what, table, wheel_value, source):
        """One fact: the table's value equals the wheel's (sets compared as sets, naming what differs)."""
        self.checked += 1
        if isinstance(wheel_value, (set, frozenset)):
            table = set(table)
            extra, missing = sorted(table - wheel_value), sorted(wheel_value - table)
            if extra or missing:
                self.problems.append(
                    "%s (%s): %s%s"
                    % (
                        what,
                        source,
                        "not in the wheel: %s" % ", ".join(extra) if extra else "",
                        ("; " if extra and missing else "") + ("missing: %s" % ", ".join(missing) if missing else ""),
                    )
                )
        elif table != wheel_value:
            self.problems.append("%s (%s): table %r, wheel %r" % (what, source, table, wheel_value))


def check(wheel, tables):
    validator, parse, simulator, simspec, product = tables
    report = Report()
    same = report.same
    fields = speculative_fields(wheel)
    names = set(fields)
    refused_by_verify = set(verify_args_refuses(wheel))
    src = SPECULATIVE + " SpeculativeConfig"
    same("validator VLLM_FIELDS", validator.VLLM_FIELDS, names - refused_by_verify, src + " fields less _verify_args'")
    same(
        "validator REFUSED_FIELDS that are fields",
        set(validator.REFUSED_FIELDS) & names,
        refused_by_verify,
        src + "._verify_args",
    )
    for name in validator.REFUSED_FIELDS:
        if name not in names and name not in refused_by_verify:
            report.checked += 1  # refused as no field at all: it must indeed be none
    same(
        "validator fields refused as gone",
        {n for n in validator.REFUSED_FIELDS if n not in refused_by_verify} & names,
        set(),
        src + " fields",
    )
    same("simulator FIELDS", simspec.FIELDS, names, src + " fields")
    for name, kind in sorted(parse._FIELD_KINDS.items()):
        if name not in names:
            continue
        annotation, bounds = fields[name]
        if kind == "positive_int":
            same(
                "validator %s: a positive integer" % name,
                True,
                annotation.startswith("int") and (bounds.get("gt") == 0 or bounds.get("ge") == 1),
                src + "." + name,
            )
        elif kind == "bool":
            same("validator %s: a boolean" % name, True, annotation.split(" ")[0] == "bool", src + "." + name)
    methods = set(speculative_literal(wheel, "SpeculativeMethod"))
    mtp = set(speculative_literal(wheel, "MTPModelTypes"))
    same("validator VLLM_METHODS", validator.VLLM_METHODS, methods, SPECULATIVE + " SpeculativeMethod")
    same("validator MTP_METHODS (less mtp)", validator.MTP_METHODS, mtp - {"mtp"}, SPECULATIVE + " MTPModelTypes")
    same(
        "validator SUPPORTED_METHODS within vLLM's",
        set(validator.SUPPORTED_METHODS) - methods,
        set(),
        SPECULATIVE + " SpeculativeMethod",
    )
    same(
        "validator REMOVED_METHODS still methods",
        set(validator.REMOVED_METHODS) & methods,
        set(),
        SPECULATIVE + " SpeculativeMethod",
    )
    same(
        "simulator methods",
        simspec.METHODS_WITH_DRAFTER | simspec.METHODS_WITHOUT_DRAFTER | simspec.MTP_METHODS,
        methods,
        SPECULATIVE + " SpeculativeMethod",
    )
    same("simulator MTP_METHODS", simspec.MTP_METHODS, mtp, SPECULATIVE + " MTPModelTypes")
    same(
        "simulator LEGACY_METHODS still methods",
        simspec.LEGACY_METHODS & methods,
        set(),
        SPECULATIVE + " SpeculativeMethod",
    )
    same(
        "validator DRAFT_SAMPLE_METHODS",
        validator.DRAFT_SAMPLE_METHODS,
        tuple(speculative_literal(wheel, "DraftSampleMethod")),
        SPECULATIVE + " DraftSampleMethod",
    )
    same(
        "validator INFERRED_BY_NAME",
        list(validator.INFERRED_BY_NAME),
        inferred_by_name(wheel),
        SPECULATIVE + " SpeculativeConfig.__post_init__",
    )
    same(
        "validator BATCH_DEFAULTS",
        [row[1:] for row in validator.BATCH_DEFAULTS],
        batch_defaults(wheel)[::-1],
        "vllm/engine/arg_utils.py get_batch_defaults (OPENAI_API_SERVER, small to large GPUs)",
    )
    check_process_facts(report, wheel, simulator)
    check_metrics(report, wheel, simulator, product)
    return report


def wheel_version(wheel):
    """vllm/_version.py: __version__ = version = '...'."""
    for node in wheel.tree("vllm/_version.py").body:
        if isinstance(node, ast.Assign) and any(ast.unparse(t) == "__version__" for t in node.targets):
            return node.value.value
    raise LookupError("no __version__ in vllm/_version.py")


def check_process_facts(report, wheel, simulator):
    same = report.same
    import simvllm

    same(
        "simulator __version__ (vllm --version, /version)",
        simvllm.__version__,
        wheel_version(wheel),
        "vllm/_version.py",
    )
    same(
        "simulator SHUTDOWN_TIMEOUT_DEFAULT",
        simulator.SHUTDOWN_TIMEOUT_DEFAULT,
        class_default(wheel, "vllm/engine/arg_utils.py", "EngineArgs", "shutdown_timeout"),
        "vllm/engine/arg_utils.py EngineArgs.shutdown_timeout",
    )
    same(
        "simulator SHUTDOWN_TIMEOUT_DEFAULT",
        simulator.SHUTDOWN_TIMEOUT_DEFAULT,
        class_default(wheel, "vllm/config/vllm.py", "VllmConfig", "shutdown_timeout"),
        "vllm/config/vllm.py VllmConfig.shutdown_timeout",
    )
    same(
        "simulator WORKER_SHUTDOWN_TIMEOUT_DEFAULT",
        simulator.WORKER_SHUTDOWN_TIMEOUT_DEFAULT,
        float(env_default(wheel, "VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS")),
        "vllm/envs.py VLLM_WORKER_SHUTDOWN_TIMEOUT_SECONDS",
    )
    same(
        "simulator BEST_EFFORT_WINDOW",
        simulator.BEST_EFFORT_WINDOW,
        best_effort_window(wheel),
        "vllm/v1/utils.py shutdown",
    )
    same(
        "simulator WORKER_SIGTERM_WAIT",
        simulator.WORKER_SIGTERM_WAIT,
        float(worker_second_wait(wheel)),
        "vllm/v1/executor/multiproc_executor.py MultiprocExecutor._ensure_worker_termination",
    )
    same(
        "simulator GPU_MEMORY_UTILIZATION_DEFAULT",
        simulator.GPU_MEMORY_UTILIZATION_DEFAULT,
        class_default(wheel, "vllm/config/cache.py", "CacheConfig", "gpu_memory_utilization"),
        "vllm/config/cache.py CacheConfig.gpu_memory_utilization",
    )
    same(
        "simulator PROCESS_NAME_PREFIX",
        simulator.PROCESS_NAME_PREFIX,
        env_default(wheel, "VLLM_PROCESS_NAME_PREFIX"),
        "vllm/envs.py VLLM_PROCESS_NAME_PREFIX",
    )
    base, parts = worker_title_parts(wheel)
    source = "vllm/v1/executor/multiproc_executor.py setup_proc_title_and_log_prefix"
    same("simulator WORKER_TITLE", simulator.WORKER_TITLE, base, source)
    same("simulator WORKER_TITLE_PARTS", list(simulator.WORKER_TITLE_PARTS), parts, source)
    found = titles(wheel)
    same(
        "simulator ENGINE_CORE_TITLE",
        simulator.ENGINE_CORE_TITLE,
        found["engine_core"],
        "vllm/v1/engine/core.py EngineCoreProc.run_engine_core",
    )
    same(
        "simulator ENGINE_CORE_DP_TITLE",
        simulator.ENGINE_CORE_DP_TITLE,
        found["engine_core_dp"],
        "vllm/v1/engine/core.py EngineCoreProc.run_engine_core",
    )
    same(
        "simulator DP_COORDINATOR_TITLE",
        simulator.DP_COORDINATOR_TITLE,
        found["dp_coordinator"],
        "vllm/v1/engine/coordinator.py DPCoordinatorProc",
    )
    same(
        "simulator API_SERVER_TITLE",
        simulator.API_SERVER_TITLE,
        found["api_server"] + "_",
        "vllm/v1/utils.py run_api_server_worker_proc (set_process_title(name, index): name_index)",
    )


def check_metrics(report, wheel, simulator, product):
    same = report.same
    types = metric_types(wheel)
    source = "vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py"
    for name, kind in sorted(simulator.METRICS.items()):
        same("simulator metric %s" % name, kind, types.get(name, "absent"), source)
    for constant in ("RUNNING", "WAITING", "DRAFTS", "DRAFT_TOKENS", "ACCEPTED_TOKENS", "ACCEPTED_PER_POSITION"):
        exported = getattr(product, constant)
        base = exported[: -len("_total")] if exported.endswith("_total") else exported
        kind = types.get(base, "absent")
        same(
            "_vllm_api %s = %s" % (constant, exported),
            exported,
            base + "_total" if kind == "counter" else (base if kind == "gauge" else "absent"),
            source + " (prometheus_client adds _total to a counter)",
        )
    same(
        "simulator METRIC_LABELS",
        list(simulator.METRIC_LABELS),
        metric_labels(wheel),
        "vllm/v1/metrics/loggers.py PrometheusStatLogger labelnames",
    )
    same(
        "simulator METRIC_MODEL_NAME",
        simulator.METRIC_MODEL_NAME,
        served_name_rule(wheel),
        "vllm/config/model.py get_served_model_name",
    )
    same(
        "_vllm_api METRIC_MODEL_NAME",
        product.METRIC_MODEL_NAME,
        served_name_rule(wheel),
        "vllm/config/model.py get_served_model_name",
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--version", default="0.33.0")
    parser.add_argument("--wheel", help="a vllm wheel already on disk (no download)")
    parser.add_argument(
        "--cache",
        default=os.environ.get("GPUOPS_WHEEL_CACHE")
        or os.path.join(os.path.expanduser("~"), ".cache", "gpuops-nvidia", "wheels"),
    )
    args = parser.parse_args(argv)
    path = args.wheel or fetch_wheel(args.version, args.cache)
    print("wheel: %s" % os.path.basename(path))
    print("sha256: %s" % sha256(path))
    tables = load_tables()
    if tables[0].VLLM_VERSION != args.version:
        print("WRONG: validator VLLM_VERSION %s, checked against %s" % (tables[0].VLLM_VERSION, args.version))
        return 1
    try:
        report = check(Wheel(path), tables)
    except (LookupError, KeyError, AttributeError) as error:
        where = traceback.extract_tb(error.__traceback__)[-1]
        print(
            "WRONG: the wheel's source no longer has the shape this script reads (%s, line %d): %r"
            % (where.name, where.lineno, error)
        )
        return 1
    for problem in report.problems:
        print("WRONG: %s" % problem)
    print(
        "%d fact(s) checked against vllm %s: %s"
        % (report.checked, args.version, "%d wrong" % len(report.problems) if report.problems else "all agree")
    )
    return 1 if report.problems else 0


if __name__ == "__main__":
    sys.exit(main())
