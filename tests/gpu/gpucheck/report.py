# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the GPU check concludes: observations drawn from the scenario results, their comparison with
the simulator (tests/sim/README.md), the simulator knobs that would match this GPU, and the Markdown
table of docs/hardware.md. Pure functions of the result dict that check.py writes as JSON.
"""

from __future__ import annotations

import statistics

from gpucheck import attribution

MINOR = "<minor>"
NVML_FILES = [
    "/dev/nvidia-caps/nvidia-cap1",
    "/dev/nvidia-caps/nvidia-cap2",
    "/dev/nvidia-uvm",
    "/dev/nvidia" + MINOR,
    "/dev/nvidiactl",
]

# The simulator's behaviour (tests/sim/README.md, fakenvml.c defaults, simvllm) for each observation:
# (value, tolerance for numbers, what it means). A simulated context is opened like simvllm's GPU ranks.
SIMULATOR = {
    "idle_used_mib": (0, 16, "NVML v2 used on an idle GPU (knob idle_used_mib, default 0)"),
    "reserved_mib": (529, 0, "NVML v2 reserved (knob reserved_mib, default 529, modelled on an H100 80GB)"),
    "v1_used_includes_reserved": (True, None, "NVML v1 used = v2 used + reserved"),
    "context_overhead_mib": (0, 2, "driver-listed MiB of a holder minus the bytes it allocated (largest seen)"),
    "unexplained_mib_with_holders": (0, 16, "used MiB no listed process explains while only listed holders exist"),
    "holder_process_lists": (["compute"], None, "driver process lists showing a CUDA holder"),
    "driver_reports_process_memory": (True, None, "the driver's list gives each listed holder's memory (not N/A)"),
    "holder_seen_in": (["driver", "fd", "mapping"], None, "where gpu_facts saw a listed CUDA holder"),
    "holder_device_files": (
        ["/dev/nvidia-uvm", "/dev/nvidia" + MINOR, "/dev/nvidiactl"],
        None,
        "/dev/nvidia* files a CUDA holder keeps open",
    ),
    "nvml_client_device_files": (
        NVML_FILES,
        None,
        "/dev/nvidia* files an NVML client (no CUDA) keeps open (as on a real 580 driver, root: caps and UVM too)",
    ),
    "driver_lists_tp_workers": (True, None, "every VLLM::Worker_TP process is in the driver's list"),
    "driver_lists_non_gpu_processes": (False, None, "API server or EngineCore without CUDA in the driver's list"),
    "inherited_driver_lists_parent": (True, None, "the allocating parent is listed while its forked child lives"),
    "inherited_driver_lists_child": (False, None, "a child that only inherited the handles is listed"),
    "inherited_memory_kept_after_parent_exit": (
        True,
        None,
        "the inherited handles keep the memory after the parent is SIGKILLed",
    ),
    "inherited_driver_lists_child_after_parent_exit": (
        False,
        None,
        "the inheriting child is listed once the parent is gone",
    ),
    "inherited_driver_lists_dead_parent": (
        True,
        None,
        "the dead parent's PID stays listed while the child keeps the memory",
    ),
    "attribution_device_files": (
        {
            "context": ["/dev/nvidia-uvm", "/dev/nvidia" + MINOR, "/dev/nvidiactl"],
            "nvml_only": NVML_FILES,
            "inherited_child": ["/dev/nvidia-uvm", "/dev/nvidia" + MINOR, "/dev/nvidiactl"],
            "cuda_init": ["/dev/nvidia-uvm", "/dev/nvidia" + MINOR, "/dev/nvidiactl"],
        },
        None,
        "/dev/nvidia* fds per attribution case (nvml_only: every GPU's file; the others: the visible GPU's)",
    ),
    "attribution_maps_device": (
        dict(dict.fromkeys(attribution.CASE_NAMES, True), nvml_only=False),
        None,
        "whether each attribution case has /dev/nvidia* lines in /proc/PID/maps (the check's simulated processes map "
        "as real ones do: workload.py PLANTS; NVML maps nothing)",
    ),
    "attribution_driver_lists": (
        dict(dict.fromkeys(attribution.CASE_NAMES, False), context=True),
        None,
        "whether the driver's lists show each attribution case",
    ),
    "attribution_gpu_facts": (
        {
            "context": "holder (driver)",
            "nvml_only": "device user (nvml)",
            "inherited_child": "holder (device_file)",
            "cuda_init": "device user (cuda)",
        },
        None,
        "what gpu_facts makes of each attribution case on the GPU under test",
    ),
    "reused_pid_listed": (
        True,
        None,
        "the driver lists a dead creator's PID number with its memory after another process got the number",
    ),
    "mps_client_lists": (["mps"], None, "driver process lists showing an MPS client"),
    "mps_server_lists": (["compute"], None, "driver process lists showing the MPS server"),
    "nested_driver_pid": (
        "host",
        None,
        "PID the driver lists for a holder in a nested PID namespace (host, namespace, none)",
    ),
    "driver_unlists_at_exit": (
        False,
        None,
        "a SIGKILLed holder leaves the driver's list within 50 ms of its exit (both drivers list it until the release)",
    ),
    "release_s_1gib": (0.5, 0.25, "seconds from SIGKILL to memory released, 1 GiB (knob release_latency 0.5)"),
    "release_s_10gib": (0.5, 0.25, "same, 10 GiB"),
    "release_s_50gib": (0.5, 0.25, "same, 50 GiB"),
}


# Observations of scenarios a simulated node skips (check.py SIM_CANNOT): compared on real GPUs only.
NOT_ON_SIM = ("mps_client_lists", "mps_server_lists")


def _scenario(result, name):
    scenario = result.get("scenarios", {}).get(name) or {}
    return scenario if scenario.get("status") in ("ok", "failed") else {}


def normalize_device_files(paths, minors):
    """Sorted distinct paths with /dev/nvidiaN (N one of `minors`) written as /dev/nvidia<minor>."""
    names = {"/dev/nvidia%d" % minor for minor in minors}
    return sorted({"/dev/nvidia" + MINOR if path in names else path for path in paths})


def observations(result):
    """{observation name (keys of SIMULATOR): value or None when not measured} from a check result."""
    obs = dict.fromkeys(SIMULATOR)
    minors = result.get("gpu", {}).get("all_minors") or []
    idle = _scenario(result, "idle")
    if idle:
        memory = idle["memory"]
        obs["idle_used_mib"] = memory["used_mib"]
        obs["reserved_mib"] = memory["reserved_mib"]
        if memory["reserved_mib"] is not None:
            obs["v1_used_includes_reserved"] = (
                abs(memory["used_v1_mib"] - memory["used_mib"] - memory["reserved_mib"]) <= 1
            )
        obs["nvml_client_device_files"] = normalize_device_files(idle["nvml_client_device_files"], minors)
    _holder_observations(result, obs)
    _attribution_observations(result, obs, minors)
    _driver_observations(result, obs)
    _release_observations(result, obs)
    return obs


def _holder_observations(result, obs):
    """The observations of the holders of vllm_tree, inherited, sigterm_ignored and nested_pidns."""
    holders = [
        h
        for name in ("vllm_tree", "inherited", "sigterm_ignored", "nested_pidns")
        for h in _scenario(result, name).get("holders", {}).values()
        if h.get("bytes")
    ]
    overheads = [h["listed_mib"] - (h["bytes"] >> 20) for h in holders if h.get("listed_mib") is not None]
    if overheads:
        obs["context_overhead_mib"] = max(overheads, key=abs)
    listed = [h for h in holders if h.get("lists")]
    if listed:
        obs["holder_process_lists"] = sorted({name for h in listed for name in h["lists"]})
        obs["driver_reports_process_memory"] = all(h.get("listed_mib") is not None for h in listed)
        obs["holder_seen_in"] = sorted({name for h in listed for name in (h.get("seen_in") or [])})
        obs["holder_device_files"] = normalize_device_files(
            {p for h in listed for p in h["device_files"]}, [result["gpu"]["minor"]]
        )
    tree = _scenario(result, "vllm_tree")
    if tree:
        workers = [h for name, h in tree["holders"].items() if ".tp" in name]
        others = [h for name, h in tree["holders"].items() if ".tp" not in name]
        obs["driver_lists_tp_workers"] = bool(workers) and all(h["lists"] for h in workers)
        obs["driver_lists_non_gpu_processes"] = any(h["lists"] for h in others)
        obs["unexplained_mib_with_holders"] = tree["gpu_facts"]["unexplained_mib"]
    inherited = _scenario(result, "inherited")
    if inherited:
        obs["inherited_driver_lists_parent"] = bool(inherited["holders"]["inherit"]["lists"])
        obs["inherited_driver_lists_child"] = bool(inherited["holders"]["inherit.child"]["lists"])
        after = inherited["after_parent_exit"]
        obs["inherited_memory_kept_after_parent_exit"] = after["memory_kept"]
        obs["inherited_driver_lists_child_after_parent_exit"] = bool(after["child_lists"])
        obs["inherited_driver_lists_dead_parent"] = bool(after["parent_lists"])
    nested = _scenario(result, "nested_pidns")
    if nested:
        obs["nested_driver_pid"] = nested["driver_pid"]


def _attribution_observations(result, obs, minors):
    """The observations of the attribution scenario's four processes, each in its deciding reading."""
    attributed = _scenario(result, "attribution")
    gpu = result.get("gpu") or {}
    decided = {
        case: (attributed.get("readings") or {}).get(phase, {}).get(case)
        for case, _what, phase, _expected in attribution.CASES
    }
    decided = {case: reading for case, reading in decided.items() if reading}
    if decided:
        obs["attribution_device_files"] = {
            case: normalize_device_files(
                r["record"]["device_fds"], minors if case == "nvml_only" else [gpu.get("minor")]
            )
            for case, r in decided.items()
        }
        obs["attribution_maps_device"] = {case: bool(r["record"]["device_mappings"]) for case, r in decided.items()}
        obs["attribution_driver_lists"] = {case: bool(r["record"]["driver"]) for case, r in decided.items()}
        obs["attribution_gpu_facts"] = {
            case: attribution.summary(r["facts"], gpu.get("index", 0)) for case, r in decided.items()
        }


def _driver_observations(result, obs):
    """The observations of reused_pid and mps."""
    reused = _scenario(result, "reused_pid")
    if reused.get("reuse"):
        obs["reused_pid_listed"] = reused["reuse"]["listed"]
    serving = ((_scenario(result, "mps").get("readings") or {}).get("serving")) or {}
    for case, key in (("mps_client", "mps_client_lists"), ("mps_server", "mps_server_lists")):
        if case in serving:
            obs[key] = sorted(entry for gpu in serving[case]["record"]["driver"].values() for entry in gpu["lists"])


def _release_observations(result, obs):
    """The observations of release_latency."""
    latency = result.get("scenarios", {}).get("release_latency", {}).get("sizes", {})
    gaps = []
    for gib, size in latency.items():
        seconds = size.get("seconds") or {}
        key = "release_s_%sgib" % gib
        if key in obs and seconds.get("released") is not None:
            obs[key] = seconds["released"]
        if seconds.get("exited") is not None and seconds.get("unlisted") is not None:
            gaps.append(seconds["unlisted"] - seconds["exited"])
    if gaps:
        obs["driver_unlists_at_exit"] = max(gaps) <= 0.05


def compare(obs):
    """[{"item", "simulator", "real", "same", "meaning"}] for every measured observation; numbers are
    the same within the tolerance of SIMULATOR."""
    rows = []
    for item, (expected, tolerance, meaning) in SIMULATOR.items():
        real = obs.get(item)
        if real is None:
            continue
        if tolerance is not None and isinstance(real, (int, float)) and not isinstance(real, bool):
            same = abs(real - expected) <= tolerance
        else:
            same = real == expected
        rows.append({"item": item, "simulator": expected, "real": real, "same": same, "meaning": meaning})
    return rows


def suggested_sim_knobs(result):
    """gpunode knobs (tests/sim/README.md) that make a simulated node report what this GPU did."""
    gpu = result.get("gpu") or {}
    idle = _scenario(result, "idle")
    knobs = {"model_name": gpu.get("name"), "memory_mib": gpu.get("memory_total_mib")}
    if idle:
        knobs.update(reserved_mib=idle["memory"]["reserved_mib"], idle_used_mib=idle["memory"]["used_mib"])
    after_exit = [
        s["seconds"]["released"] - (s["seconds"]["exited"] or 0.0)
        for s in result.get("scenarios", {}).get("release_latency", {}).get("sizes", {}).values()
        if (s.get("seconds") or {}).get("released") is not None
    ]
    if after_exit:
        knobs["release_latency"] = round(max(0.0, statistics.median(after_exit)), 3)
    return knobs


def _cell(value, unit=""):
    return "–" if value is None else "%s%s" % (value, unit)


def _seconds(value):
    return "–" if value is None else "%.2f" % value


def table_row(result):
    """The cells of one docs/hardware.md row for a check result."""
    gpu, driver = result.get("gpu") or {}, result.get("driver") or {}
    obs = result.get("observations") or observations(result)
    idle = _scenario(result, "idle")
    idle_cell = (
        "–" if not idle else "%s / %s" % (_cell(idle["memory"]["used_mib"]), _cell(idle["memory"]["reserved_mib"]))
    )
    inherited = "–"
    if obs.get("inherited_driver_lists_child") is not None:
        inherited = "%s / %s" % (
            "listed" if obs["inherited_driver_lists_child"] else "not listed",
            "kept" if obs["inherited_memory_kept_after_parent_exit"] else "freed",
        )
    release = " / ".join(_seconds(obs.get("release_s_%dgib" % gib)) for gib in (1, 10, 50))
    tree = _scenario(result, "vllm_tree")
    reset = "–"
    if tree and tree.get("gpu_kill") and tree.get("gpu_wait"):
        reset = "%s + %s" % (_seconds(tree["gpu_kill"].get("elapsed_s")), _seconds(tree["gpu_wait"].get("elapsed_s")))
    differences = result.get("differences")
    if differences is None:
        differences = [row for row in compare(obs) if not row["same"]]
    scenarios = result.get("scenarios") or {}
    return [
        result.get("date", "")[:10],
        "%s (%s MiB)" % (gpu.get("name"), gpu.get("memory_total_mib")),
        "%s (CUDA %s)" % (driver.get("driver_version"), driver.get("cuda_driver_version")),
        (result.get("host") or {}).get("backend") or "–",
        idle_cell,
        _cell(obs.get("context_overhead_mib")),
        holders_cell(result),
        inherited,
        attribution_cell(result),
        release,
        pinned_cell(scenarios.get("pinned_release")),
        reset,
        " · ".join((scenarios.get(name) or {}).get("status") or "–" for name in DRIVER_SCENARIOS),
        "%d (%s)" % (len(differences), result.get("status")),
    ]


def holders_cell(result):
    """ "5/6 · 6/6": of the GPU-holding processes of vllm_tree, inherited, sigterm_ignored and nested_pidns, how many
    the driver lists and how many gpu_facts' /proc scan finds."""
    holders = [
        h
        for name in ("vllm_tree", "inherited", "sigterm_ignored", "nested_pidns")
        for h in _scenario(result, name).get("holders", {}).values()
        if h.get("bytes") or h.get("role") == "inherited"
    ]
    if not holders:
        return "–"
    listed = sum(1 for h in holders if h.get("lists"))
    return "%d/%d · %d/%d" % (listed, len(holders), sum(1 for h in holders if h.get("found_by_scan")), len(holders))


def attribution_cell(result):
    """ "4/4": of the attribution scenario's cases, how many gpu_facts judged as expected."""
    attributed = _scenario(result, "attribution")
    decided = [
        (attributed.get("readings") or {}).get(phase, {}).get(case)
        for case, _what, phase, _expected in attribution.CASES
    ]
    decided = [reading for reading in decided if reading]
    if not decided:
        return "–"
    return "%d/%d" % (sum(1 for reading in decided if reading["meets"]), len(attribution.CASES))


def pinned_cell(scenario):
    """ "32 GiB: 2.47 / 2.47 / 4.85" (GPU memory back / unlisted / exited, seconds after SIGKILL), the scenario's status
    where it did not measure, – where it did not run."""
    if not scenario:
        return "–"
    seconds = scenario.get("seconds") or {}
    if scenario.get("status") != "ok" or not seconds:
        return "%s%s" % (scenario.get("status"), " (%s)" % scenario["reason"] if scenario.get("reason") else "")
    return "%s GiB: %s" % (
        scenario.get("pinned_gib"),
        " / ".join(_seconds(seconds.get(key)) for key in ("released", "unlisted", "exited")),
    )


COLUMNS = [
    "Date",
    "GPU",
    "Driver",
    "Backend",
    "Idle used / reserved (MiB)",
    "Context overhead (MiB)",
    "Holders listed by driver · found by /proc scan",
    "Inherited-handle child: driver / memory",
    "Attribution cases as expected",
    "Release after SIGKILL 1 / 10 / 50 GiB (s)",
    "Release with pinned host memory: GPU memory back / unlisted / exited (s)",
    "gpu_kill + gpu_wait, vLLM TP=2 (s)",
    "Dead creator · reused PID · MPS · IPC",
    "Differences (status)",
]
DRIVER_SCENARIOS = ("dead_creator", "reused_pid", "mps", "ipc")
DRIVER_TITLES = {
    "dead_creator": "A dead creator's context held by its forked child, beside bystanders; every process selected",
    "reused_pid": "The dead creator's PID number given to an NVML-only client",
    "mps": "MPS with a private control daemon: client, server, daemon",
    "ipc": "CUDA IPC: exporter and importer, the exporter SIGKILLed",
}


def mig_line(mig):
    """ "MIG mode: current disabled, pending disabled" from result["gpu"]["mig_mode"]."""
    if not mig:
        return "MIG mode: not read"
    if mig.get("error"):
        return "MIG mode: not available (%s)" % mig["error"]
    names = {0: "disabled", 1: "enabled"}
    return "MIG mode: current %s, pending %s (nvmlDeviceGetMigMode)" % (
        names.get(mig["current"], mig["current"]),
        names.get(mig["pending"], mig["pending"]),
    )


def render_markdown(results):
    """docs/hardware.md's results table for `results` (check result dicts), then each run's differences."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(cell) for cell in table_row(result)) + " |" for result in results]
    for result in results:
        gpu = result.get("gpu") or {}
        lines += ["", "%s, %s: %s" % (gpu.get("name"), result.get("date", "")[:10], mig_line(gpu.get("mig_mode")))]
        attributed = (result.get("scenarios") or {}).get("attribution")
        if attributed and attributed.get("readings"):
            lines += [
                "",
                "Attribution (docs/attribution.md) of four real processes on GPU %s, %s, %s:"
                % (gpu.get("index"), gpu.get("name"), result.get("date", "")[:10]),
                "",
            ]
            lines += attribution.render_table(attributed, gpu.get("all_minors") or [])
        elif attributed:
            lines += ["", "Attribution: %s (%s)" % (attributed.get("status"), attributed.get("reason"))]
        lines += driver_lines(result)
        differences = result.get("differences")
        if differences is None:
            differences = [
                row for row in compare(result.get("observations") or observations(result)) if not row["same"]
            ]
        lines += [
            "",
            "Differences from the simulator, %s, %s:"
            % ((result.get("gpu") or {}).get("name"), result.get("date", "")[:10]),
        ]
        lines += [
            "- `%s`: real %s, simulator %s (%s)" % (row["item"], row["real"], row["simulator"], row["meaning"])
            for row in differences
        ] or ["- none"]
        knobs = result.get("suggested_sim_knobs") or suggested_sim_knobs(result)
        lines.append("- simulator knobs matching this GPU: " + ", ".join("%s=%s" % kv for kv in sorted(knobs.items())))
    return "\n".join(lines) + "\n"


def driver_lines(result):
    """The Markdown of the dead_creator, reused_pid, mps and ipc scenarios of one result: each one's table of
    processes (attribution.render_table) and its failed checks, or its status and reason."""
    gpu = result.get("gpu") or {}
    lines = []
    for name in DRIVER_SCENARIOS:
        scenario = (result.get("scenarios") or {}).get(name)
        if not scenario:
            continue
        head = "%s (`%s`): %s" % (DRIVER_TITLES[name], name, scenario.get("status"))
        if scenario.get("reason"):
            head += " (%s)" % scenario["reason"]
        lines += ["", head + ":" if scenario.get("readings") else head]
        if scenario.get("readings"):
            lines += [""] + attribution.render_table(
                scenario, gpu.get("all_minors") or [], attribution.SCENARIO_CASES[name]
            )
        failed = [check for check in scenario.get("checks") or [] if not check["ok"]]
        lines += ["- failed: %s (%s)" % (check["name"], check["detail"]) for check in failed]
    return lines
