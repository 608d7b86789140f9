#!/usr/bin/env python
# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Compare the collection's vLLM tables with the vLLM wheels they were read from (`make check-vllm-source`).

The collection knows several vLLM releases (plugins/module_utils/vllm/_vllm_versions.py VERSIONS) and keeps its facts
per release, keyed by version: the validator's (plugins/module_utils/vllm/_speculative_vllm.py, _speculative_parse.py),
the role's (plugins/module_utils/vllm/_vllm_server_facts.py, the metric names of vllm/_metrics_text.py, the flags
plugin_utils/_vllm_checks.py refuses) and the simulator's (tests/sim/simvllm/facts.py). They were written by
reading each release's wheel; this script reads each wheel again, with `ast` (a wheel is never installed or
imported), and fails naming every speculative-config field, method, MTP name, metric name, flag, process title or
default that a table gets wrong for that release.

Usage: scripts/check_vllm_source.py [--version 0.34.0] [--wheel PATH] [--cache DIR]
Without --version every known release is checked; --wheel checks one wheel already on disk. Each wheel is
downloaded once with `pip download --no-deps vllm==VERSION` into the cache directory (default:
$GPUOPS_WHEEL_CACHE, else ~/.cache/gpuops-nvidia/wheels). Exit status 0 when every fact agrees, 1 when one does
not, 2 when a wheel cannot be had.
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
import typing
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
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
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


def _set_by_vllm(node):
    """Whether a dataclass field is `field(..., init=False)`: vLLM fills it, pydantic refuses it as an argument."""
    value = node.value
    return (
        isinstance(value, ast.Call)
        and ast.unparse(value.func) in ("field", "dataclasses.field")
        and any(
            k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False for k in value.keywords
        )
    )


def set_by_vllm(wheel):
    """SpeculativeConfig fields that vLLM fills itself (init=False): refused as input (custom_method, 0.34)."""
    body = find(wheel.tree(SPECULATIVE), ast.ClassDef, "SpeculativeConfig").body
    return {
        node.target.id
        for node in body
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and _set_by_vllm(node)
    }


def speculative_fields(wheel):
    """{field: (annotation source, Field keyword dict)} of SpeculativeConfig that a user may set."""
    tree = wheel.tree(SPECULATIVE)
    fields = {}
    for node in find(tree, ast.ClassDef, "SpeculativeConfig").body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        annotation = ast.unparse(node.annotation)
        if annotation.startswith("SkipValidation") or _set_by_vllm(node):
            continue  # filled by the engine (target_model_config & co.) or by vLLM itself (custom_method)
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


def _name_marker(node):
    """ "marker" of a test `"marker" in <draft model>.lower()`, or None."""
    compare = node.values[0] if isinstance(node, ast.BoolOp) else node
    if (
        isinstance(compare, ast.Compare)
        and isinstance(compare.ops[0], ast.In)
        and isinstance(compare.left, ast.Constant)
        and ast.unparse(compare.comparators[0]).endswith(".lower()")
    ):
        return compare.left.value
    return None


SPECULATOR_CONFIG = "vllm/v1/worker/gpu/spec_decode/speculator_config.py"


def _detected_by_checkpoint(wheel):
    """0.34: (marker, method) pairs of the speculator configs' matches(), in _CHECKPOINT_DETECTION_ORDER (the MTP
    config matches by model_type, not by name)."""
    tree = wheel.tree(SPECULATOR_CONFIG)
    order = ast.literal_eval(module_assign(tree, "_CHECKPOINT_DETECTION_ORDER"))
    configs = module_assign(tree, "_CONFIG_BY_METHOD")
    pairs = []
    for key, value in zip(configs.keys, configs.values):
        if key.value not in order or not (isinstance(value, ast.Call) and ast.unparse(value.func) == "_builtin"):
            continue
        module, class_name = (argument.value for argument in value.args)
        path = "vllm/v1/worker/gpu/spec_decode/%s.py" % module.replace(".", "/")
        matches = find(find(wheel.tree(path), ast.ClassDef, class_name), ast.FunctionDef, "matches")
        markers = [_name_marker(node.value) for node in ast.walk(matches) if isinstance(node, ast.Return)]
        pairs += [(order.index(key.value), marker, key.value) for marker in markers if marker]
    return [(marker, method) for _index, marker, method in sorted(pairs)]


def inferred_by_name(wheel):
    """((marker, method) pairs, where they are read): up to 0.33 `elif "marker" in <draft model>.lower():
    self.method = "method"` in SpeculativeConfig.__post_init__; in 0.34 the speculator configs' matches()."""
    body = find(wheel.tree(SPECULATIVE), ast.FunctionDef, "__post_init__")
    pairs = []
    for node in ast.walk(body):
        if isinstance(node, ast.If) and _name_marker(node.test) is not None:
            assign = node.body[0]
            if isinstance(assign, ast.Assign) and ast.unparse(assign.targets[0]) == "self.method":
                pairs.append((_name_marker(node.test), assign.value.value))
    if pairs:
        return pairs, SPECULATIVE + " SpeculativeConfig.__post_init__"
    return _detected_by_checkpoint(wheel), SPECULATOR_CONFIG + " _CHECKPOINT_DETECTION_ORDER, matches()"


def custom_methods(wheel):
    """Whether SpeculativeConfig.method takes any string (`SpeculativeMethod | str`: a method a plugin registers)."""
    for node in find(wheel.tree(SPECULATIVE), ast.ClassDef, "SpeculativeConfig").body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "method":
            return "str" in [part.strip() for part in ast.unparse(node.annotation).split("|")]
    raise LookupError("no SpeculativeConfig.method")


def no_effect_fields(wheel):
    """SpeculativeConfig fields whose documentation (the string after the field) says it has no effect."""
    body = find(wheel.tree(SPECULATIVE), ast.ClassDef, "SpeculativeConfig").body
    found = set()
    for node, following in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and str(following.value.value).startswith("Deprecated and has no effect")
        ):
            found.add(node.target.id)
    return found


def budget_rule(wheel):
    """(what max_num_batched_tokens must exceed per request, whether a DFlash budget lowers max_num_active_seqs):
    vllm/config/vllm.py _set_max_num_scheduled_tokens, `if max_num_batched_tokens <= X: raise`."""
    body = find(wheel.tree("vllm/config/vllm.py"), ast.FunctionDef, "_set_max_num_scheduled_tokens")
    assigned = dict(
        (ast.unparse(node.targets[0]), ast.unparse(node.value))
        for node in ast.walk(body)
        if isinstance(node, ast.Assign)
    )
    rule = None
    for node in ast.walk(body):
        if (
            isinstance(node, ast.Compare)
            and ast.unparse(node.left) == "max_num_batched_tokens"
            and isinstance(node.ops[0], ast.LtE)
        ):
            compared = ast.unparse(node.comparators[0])
            rule = assigned.get(compared, compared).rsplit(".", 1)[-1]
    if rule is None:
        raise LookupError("no max_num_batched_tokens <= X in _set_max_num_scheduled_tokens")
    return rule, "self.scheduler_config.max_num_active_seqs" in assigned


def has_env(wheel, name):
    """Whether vllm/envs.py reads the environment variable `name` (a key of its environment_variables)."""
    for node in ast.walk(wheel.tree("vllm/envs.py")):
        if isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == name for k in node.keys):
            return True
    return False


def cli_flags(wheel):
    """Every option `vllm serve` may take: the strings given to add_argument, and the fields of the dataclasses
    whose fields become options (--<field-name>) in vllm/entrypoints/**/cli_args.py."""
    paths = [n for n in wheel.zip.namelist() if n.startswith("vllm/entrypoints/") and n.endswith("cli_args.py")]
    paths += ["vllm/engine/arg_utils.py", "vllm/utils/argparse_utils.py"]
    paths += [n for n in wheel.zip.namelist() if n.startswith("vllm/entrypoints/cli/") and n.endswith(".py")]
    flags = set()
    for path in paths:
        tree = wheel.tree(path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("add_argument"):
                flags.update(a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("-"))
            if path.endswith("cli_args.py") and isinstance(node, ast.ClassDef):
                flags.update(
                    "--" + item.target.id.replace("_", "-")
                    for item in node.body
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                )
    return flags


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


class Tables:
    """The collection's tables, imported from this checkout: validator (_speculative_vllm), parse
    (_speculative_parse), server (_vllm_server_facts), product (_metrics_text), checks (_vllm_checks), versions
    (_vllm_versions), simulator (simvllm.facts), simspec (simvllm.specdecode)."""

    def __init__(self, **modules):
        self.__dict__.update(modules)


def load_tables():
    """The validator's, the role's, the simulator's and the product's tables, imported from this checkout."""
    collections = os.path.join(REPO, ".collections")
    link = os.path.join(collections, "ansible_collections", "gpuops", "nvidia")
    if not os.path.isdir(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink("../../..", link)
    sys.path[:0] = [collections, os.path.join(REPO, "tests", "sim")]
    from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _speculative_parse as parse
    from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _speculative_vllm as validator
    from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _metrics_text as product
    from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_server_facts as server
    from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm import _vllm_versions as versions
    from ansible_collections.gpuops.nvidia.plugins.plugin_utils import _vllm_checks as checks
    from simvllm import facts as simulator
    from simvllm import specdecode as simspec

    return Tables(
        validator=validator,
        parse=parse,
        server=server,
        product=product,
        checks=checks,
        versions=versions,
        simulator=simulator,
        simspec=simspec,
    )


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


# Where each known release is named, file by file (CONTRIBUTING.md, "Adding a vLLM release"). The other tables hold what
# a release changes from 0.33.0's: a fact of theirs that a release changes is named by the checks below, with its file.
RELEASE_LISTS = (
    ("plugins/module_utils/vllm/_vllm_versions.py", "VERSIONS", lambda tables: tables.versions.VERSIONS),
    ("plugins/module_utils/vllm/_vllm_versions.py", "Release", lambda tables: typing.get_args(tables.versions.Release)),
    ("tests/sim/simvllm/facts.py", "VERSIONS", lambda tables: tables.simulator.VERSIONS),
)


# The file of each table that a problem names (by a word of it), for the line "to change:" after the problems.
TABLE_FILES = (
    ("validator", "plugins/module_utils/vllm/_speculative_vllm.py (_CHANGES of the release)"),
    ("simulator", "tests/sim/simvllm/facts.py"),
    ("_vllm_server_facts", "plugins/module_utils/vllm/_vllm_server_facts.py"),
    ("_metrics_text", "plugins/module_utils/vllm/_metrics_text.py"),
    ("_vllm_checks", "plugins/plugin_utils/_vllm_checks.py"),
)


def files_to_change(problems):
    """The files that the problems' tables are in, each once, in TABLE_FILES' order."""
    named = [problem.split("): ", 1)[0] for problem in problems]
    return [path for word, path in TABLE_FILES if any(word in what for what in named)]


def missing_release(version, tables):
    """Where the release `version` is not named yet, in words ("" when every list names it)."""
    missing = {}
    for path, name, names in RELEASE_LISTS:
        if version not in names(tables):
            missing.setdefault(path, []).append(name)
    return "; ".join("add it to %s in %s" % (" and ".join(names), path) for path, names in missing.items())


def check(wheel, tables):
    """The Report of one wheel: every table of the release it holds compared with its sources."""
    version = wheel_version(wheel)
    report = Report()
    missing = missing_release(version, tables)
    if missing:
        report.problems.append(
            'vllm %s (vllm/_version.py) is not a known release: %s (CONTRIBUTING.md, "Adding a vLLM release")'
            % (version, missing)
        )
        return report
    check_fields(report, wheel, tables.validator.facts(version), tables.parse, tables.simulator.Release(version))
    check_methods(report, wheel, tables.validator.facts(version), tables.simulator.Release(version))
    check_process_facts(report, wheel, tables.simulator, version)
    check_metrics(report, wheel, tables, version)
    check_flags(report, wheel, tables.checks, version)
    return report


def check_fields(report, wheel, validator, parse, simulated):
    """The speculative-config fields of a release: settable, refused, set by vLLM, without effect, their kinds."""
    same = report.same
    fields = speculative_fields(wheel)
    names = set(fields)
    refused_by_verify = set(verify_args_refuses(wheel))
    filled = set_by_vllm(wheel)
    src = SPECULATIVE + " SpeculativeConfig"
    same("validator fields", validator.fields, names - refused_by_verify, src + " fields less _verify_args'")
    same(
        "validator refused_fields that are fields",
        set(validator.refused_fields) & (names | filled),
        refused_by_verify | filled,
        src + "._verify_args, fields with init=False",
    )
    for name in validator.refused_fields:
        if name not in names | filled:
            report.checked += 1  # refused as no field at all: it must indeed be none
    same("simulator fields", simulated.fields, names, src + " fields")
    same("simulator set_by_vllm", simulated.set_by_vllm, filled, src + " fields with init=False")
    same(
        "validator no_effect_fields", validator.no_effect_fields, no_effect_fields(wheel), src + " field documentation"
    )
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


def check_methods(report, wheel, validator, simulated):
    """The methods of a release: built-in, MTP names, removed, custom (plugins), inferred from the drafter's name."""
    same = report.same
    methods = set(speculative_literal(wheel, "SpeculativeMethod"))
    mtp = set(speculative_literal(wheel, "MTPModelTypes"))
    src = SPECULATIVE + " SpeculativeMethod"
    same("validator methods", validator.methods, methods, src)
    same("validator mtp_methods (less mtp)", validator.mtp_methods, mtp - {"mtp"}, SPECULATIVE + " MTPModelTypes")
    same("validator SUPPORTED_METHODS within vLLM's", set(validator_supported(validator)) - methods, set(), src)
    same("validator removed_methods still methods", set(validator.removed_methods) & methods, set(), src)
    same("simulator methods", simulated.methods, methods, src)
    same("simulator mtp_methods", simulated.mtp_methods, mtp, SPECULATIVE + " MTPModelTypes")
    custom = custom_methods(wheel)
    same("validator custom_methods", validator.custom_methods, custom, src + " | str (SpeculativeConfig.method)")
    same("simulator custom_methods", simulated.custom_methods, custom, src + " | str (SpeculativeConfig.method)")
    same(
        "validator draft_sample_methods",
        validator.draft_sample_methods,
        tuple(speculative_literal(wheel, "DraftSampleMethod")),
        SPECULATIVE + " DraftSampleMethod",
    )
    pairs, where = inferred_by_name(wheel)
    same("validator inferred_by_name", list(validator.inferred_by_name), pairs, where)
    same(
        "validator inferred_at", validator.inferred_at.split(" ", maxsplit=1)[0], where.split(" ", maxsplit=1)[0], where
    )
    same(
        "validator batch_defaults",
        [row[1:] for row in validator.batch_defaults],
        batch_defaults(wheel)[::-1],
        "vllm/engine/arg_utils.py get_batch_defaults (OPENAI_API_SERVER, small to large GPUs)",
    )
    rule, active_seqs = budget_rule(wheel)
    source = "vllm/config/vllm.py VllmConfig._set_max_num_scheduled_tokens"
    same("validator budget_rule", validator.budget_rule, rule, source)
    same("simulator budget_rule", simulated.budget_rule, rule, source)
    same("validator dflash_active_seqs", validator.dflash_active_seqs, active_seqs, source)
    v1 = has_env(wheel, "VLLM_USE_V2_MODEL_RUNNER")
    same("validator v1_runner", validator.v1_runner, v1, "vllm/envs.py VLLM_USE_V2_MODEL_RUNNER")
    same("simulator v1_runner", simulated.v1_runner, v1, "vllm/envs.py VLLM_USE_V2_MODEL_RUNNER")


def validator_supported(validator):
    from ansible_collections.gpuops.nvidia.plugins.module_utils.vllm._speculative_vllm import SUPPORTED_METHODS

    return SUPPORTED_METHODS


def check_flags(report, wheel, checks, version):
    """The flags the role refuses or sets are options of the release's `vllm serve`."""
    flags = cli_flags(wheel)
    role = set(checks.OWNED) | set(checks.SECRETS) | {checks.API_SERVER_COUNT, "--config", "--disable-log-stats"}
    report.same(
        "flags the role refuses (_vllm_checks) are options of vLLM %s" % version,
        set(role) - flags,
        set(),
        "add_argument calls, cli_args.py dataclass fields",
    )


def wheel_version(wheel):
    """vllm/_version.py: __version__ = version = '...'."""
    for node in wheel.tree("vllm/_version.py").body:
        if isinstance(node, ast.Assign) and any(ast.unparse(t) == "__version__" for t in node.targets):
            return node.value.value
    raise LookupError("no __version__ in vllm/_version.py")


def check_process_facts(report, wheel, simulator, version):
    same = report.same
    same(
        "simulator version string (vllm --version, /version) for SIMVLLM_VERSION=%s" % version,
        simulator.version({"SIMVLLM_VERSION": version}),
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
        "simulator gpu_memory_utilization (%s)" % version,
        simulator.Release(version).gpu_memory_utilization,
        class_default(wheel, "vllm/config/cache.py", "CacheConfig", "gpu_memory_utilization"),
        "vllm/config/cache.py CacheConfig.gpu_memory_utilization (None: resolved_gpu_memory_utilization)",
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


def check_metrics(report, wheel, tables, version):
    same = report.same
    simulator, product, server = tables.simulator, tables.product, tables.server.facts(version)
    types = metric_types(wheel)
    source = "vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py"
    for name, kind in sorted(simulator.METRICS.items()):
        same("simulator metric %s" % name, kind, types.get(name, "absent"), source)
    for name, kind in sorted(server["metrics"].items()):
        same("_vllm_server_facts metric %s" % name, kind, types.get(name, "absent"), source)
    for constant in ("RUNNING", "WAITING", "DRAFTS", "DRAFT_TOKENS", "ACCEPTED_TOKENS", "ACCEPTED_PER_POSITION"):
        exported = getattr(product, constant)
        base = exported[: -len("_total")] if exported.endswith("_total") else exported
        kind = types.get(base, "absent")
        same(
            "_metrics_text %s = %s" % (constant, exported),
            exported,
            base + "_total" if kind == "counter" else (base if kind == "gauge" else "absent"),
            source + " (prometheus_client adds _total to a counter)",
        )
        same("_metrics_text %s in _vllm_server_facts" % constant, server["metrics"].get(base), kind, "the role's table")
    same(
        "simulator METRIC_LABELS",
        list(simulator.METRIC_LABELS),
        metric_labels(wheel),
        "vllm/v1/metrics/loggers.py PrometheusStatLogger labelnames",
    )
    for who, rule in (("simulator", simulator.METRIC_MODEL_NAME), ("_metrics_text", product.METRIC_MODEL_NAME)):
        same("%s METRIC_MODEL_NAME" % who, rule, served_name_rule(wheel), "vllm/config/model.py get_served_model_name")
    check_shutdown(report, wheel, server)


def check_shutdown(report, wheel, server):
    """The role's shutdown facts (_vllm_server_facts)."""
    same = report.same
    same(
        "_vllm_server_facts shutdown_timeout_default",
        server["shutdown_timeout_default"],
        class_default(wheel, "vllm/engine/arg_utils.py", "EngineArgs", "shutdown_timeout"),
        "vllm/engine/arg_utils.py EngineArgs.shutdown_timeout",
    )
    same(
        "_vllm_server_facts worker_shutdown_default",
        server["worker_shutdown_default"],
        int(env_default(wheel, server["worker_shutdown_env"])),
        "vllm/envs.py %s" % server["worker_shutdown_env"],
    )
    same(
        "_vllm_server_facts worker_sigkill_wait",
        server["worker_sigkill_wait"],
        worker_second_wait(wheel),
        "vllm/v1/executor/multiproc_executor.py MultiprocExecutor._ensure_worker_termination",
    )


def check_wheel(path, tables):
    """Check one wheel; print its name, sha256, problems and result. Returns the number of problems (1 when its
    source changed shape)."""
    print("wheel: %s" % os.path.basename(path))
    print("sha256: %s" % sha256(path))
    wheel = Wheel(path)
    try:
        report = check(wheel, tables)
    except (LookupError, KeyError, AttributeError, ValueError) as error:
        where = traceback.extract_tb(error.__traceback__)[-1]
        print(
            "WRONG: the wheel's source no longer has the shape this script reads (%s, line %d): %r"
            % (where.name, where.lineno, error)
        )
        return 1
    for problem in report.problems:
        print("WRONG: %s" % problem)
    for path in files_to_change(report.problems):
        print("to change: %s" % path)
    print(
        "%d fact(s) checked against vllm %s: %s"
        % (report.checked, wheel_version(wheel), "%d wrong" % len(report.problems) if report.problems else "all agree")
    )
    return len(report.problems)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", maxsplit=1)[0])
    parser.add_argument("--version", help="one release to check (default: every known release)")
    parser.add_argument("--wheel", help="a vllm wheel already on disk (no download)")
    parser.add_argument(
        "--cache",
        default=os.environ.get("GPUOPS_WHEEL_CACHE")
        or os.path.join(os.path.expanduser("~"), ".cache", "gpuops-nvidia", "wheels"),
    )
    args = parser.parse_args(argv)
    tables = load_tables()
    versions = [args.version] if args.version else list(tables.versions.VERSIONS)
    paths = [args.wheel] if args.wheel else [fetch_wheel(version, args.cache) for version in versions]
    wrong = 0
    for path in paths:
        wrong += check_wheel(path, tables)
    if len(paths) > 1:
        print("%d release(s) checked: %s" % (len(paths), "%d fact(s) wrong" % wrong if wrong else "all agree"))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
