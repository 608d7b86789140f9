# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The attribution rule (docs/attribution.md) checked against raw records of real processes.

For each process the check starts in the `attribution` scenario it records, independently of the
collection: the /dev/nvidia* files its threads hold open (/proc/PID/task/TID/fd), its /proc/PID/maps lines
of /dev/nvidia* files, and the driver's process lists of every GPU that show it (NVML, with used MiB).
`by_rule` applies docs/attribution.md to those records and the GPUs' memory; `facts_view` reads what
gpu_facts (run through ansible-playbook) made of the same process; `judge` compares both and the
expectation for each case. Pure functions of plain data (check.py reads /proc and NVML).
"""

from __future__ import annotations

import re

_MINOR_RE = re.compile(r"^/dev/nvidia(\d+)$")

# The four processes, what each is, and what docs/attribution.md says gpu_facts must make of it.
# expected: {"role": "holder" | "device_user", "attribution": "driver" | "device_file" (holders, on the GPU
# under test), "kind": "cuda" | "nvml" (device users)}. phase: the reading that decides the case
# ("explained": only listed holders keep memory; "unexplained": after the parent's exit its forked child keeps the
# parent's context, which the driver lists under the dead parent's PID (docs/attribution.md rule 2)).
CASES = (
    (
        "context",
        "a CUDA context on one GPU (cuMemAlloc / torch tensor)",
        "explained",
        {"role": "holder", "attribution": "driver"},
    ),
    (
        "nvml_only",
        "an NVML-only client (pynvml nvmlInit, stays initialized)",
        "explained",
        {"role": "device_user", "kind": "nvml"},
    ),
    (
        "inherited_child",
        "a forked child of a CUDA process, after the parent's exit (inherited handles)",
        "unexplained",
        {"role": "holder", "attribution": "device_file"},
    ),
    (
        "cuda_init",
        "CUDA initialized without a context (cuInit only)",
        "explained",
        {"role": "device_user", "kind": "cuda"},
    ),
)
CASE_NAMES = tuple(case[0] for case in CASES)


def minor_of(path):
    """N of /dev/nvidiaN, else None (nvidiactl, nvidia-uvm, nvidia-caps/...)."""
    match = _MINOR_RE.match(path)
    return int(match.group(1)) if match else None


def raw_kind(device_fds, mapped):
    """What docs/attribution.md calls the process from its files alone: "cuda" (/dev/nvidia-uvm* open or
    mapped, or a /dev/nvidiaN mapped), "nvml" (other /dev/nvidia* files only), None (no device file)."""
    if any(path.startswith("/dev/nvidia-uvm") for path in list(device_fds) + list(mapped)):
        return "cuda"
    if any(minor_of(path) is not None for path in mapped):
        return "cuda"
    return "nvml" if device_fds or mapped else None


def raw_record(pid, device_fds, mapping_lines, mapped, lists_by_gpu):
    """One process's raw record: {"pid", "device_fds", "device_mappings" (maps lines), "mapped" (their paths),
    "driver" ({"<index>": {"lists", "used_mib"}} for the GPUs whose lists show it), "kind" (raw_kind)}.

    lists_by_gpu: {index: {pid: {"lists", "used_mib"}}} (driver.Gpu.all_processes()).
    """
    driver = {str(index): dict(listed[pid]) for index, listed in sorted(lists_by_gpu.items()) if pid in listed}
    return {
        "pid": pid,
        "device_fds": sorted(device_fds),
        "device_mappings": list(mapping_lines),
        "mapped": sorted(mapped),
        "driver": driver,
        "kind": raw_kind(device_fds, mapped),
    }


def gpu_memory(lists_by_gpu, used_mib_by_gpu, tolerance_mib, alive=None):
    """{index: {"used_mib", "listed_mib", "unexplained_mib", "unexplained" (counts, as docs/attribution.md rule 4),
    "exited" (listed PIDs for which alive(pid) is false: creators that exited)}}.

    used_mib_by_gpu: {index: NVML used MiB (v2 where present) or None}.
    """
    gpus = {}
    for index, listed in lists_by_gpu.items():
        used = used_mib_by_gpu.get(index)
        amounts = [entry["used_mib"] for entry in listed.values()]
        total = sum(amount for amount in amounts if amount is not None)
        if used is None:
            unexplained, counts = None, True
        elif any(amount is None for amount in amounts):
            unexplained, counts = None, False
        else:
            unexplained = max(0, used - total)
            counts = unexplained > tolerance_mib
        gpus[index] = {
            "used_mib": used,
            "listed_mib": total,
            "unexplained_mib": unexplained,
            "unexplained": counts,
            "exited": sorted(pid for pid in listed if alive is not None and not alive(pid)),
        }
    return gpus


def by_rule(record, memory, minors, translating=True):
    """docs/attribution.md applied to one raw record: {"role": "holder" | "device_user" | None, "attribution"
    ({"<index>": "driver" | "device_file"}), "foreign" (indices whose lists show it while it holds no file of
    theirs), "kind"}.

    memory: gpu_memory(); minors: the minor number of each GPU, in NVML index order; translating: the driver gives
    PIDs in the caller's namespace (535.113.01+), where memory outside the lists is nobody's here (rule 4).
    """
    index_of = {minor: index for index, minor in enumerate(minors)}
    files = {index_of[m] for m in (minor_of(p) for p in record["device_fds"] + record["mapped"]) if m in index_of}
    ctl = "/dev/nvidiactl" in record["device_fds"] or "/dev/nvidiactl" in record["mapped"]
    attribution, foreign = {}, []
    for key, entry in record["driver"].items():
        index = int(key)
        confirmed = ctl if entry["lists"] == ["mps"] else index in files and record["kind"] == "cuda"
        if confirmed:
            attribution[key] = "driver"
        else:
            foreign.append(index)
    if not attribution and record["kind"] == "cuda":
        for index in sorted(files):
            gpu = memory.get(index, {})
            unknown = "used_mib" in gpu and gpu["used_mib"] is None
            if gpu.get("exited") or (gpu.get("unexplained") and (not translating or unknown)):
                attribution[str(index)] = "device_file"
    if attribution:
        role = "holder"
    elif record["device_fds"] or record["mapped"]:
        role = "device_user"
    else:
        role = None
    return {
        "role": role,
        "attribution": dict(sorted(attribution.items())),
        "foreign": sorted(foreign),
        "kind": record["kind"],
    }


def facts_view(pid, facts):
    """What gpu_facts (ansible_facts.nvidia) says of `pid`: {"role", "attribution", "kind", "gpus",
    "device_gpus", "seen_in"}; role None when it names the process nowhere."""
    for role, key in (("holder", "holders"), ("device_user", "device_users")):
        for item in facts.get(key) or []:
            if item["pid"] == pid:
                return {
                    "role": role,
                    "attribution": dict(sorted((item.get("attribution") or {}).items())),
                    "kind": item.get("kind"),
                    "gpus": item.get("gpus", []),
                    "device_gpus": item.get("device_gpus", []),
                    "seen_in": item.get("seen_in", []),
                }
    return {"role": None, "attribution": {}, "kind": None, "gpus": [], "device_gpus": [], "seen_in": []}


def describe(view):
    """A short text for a rule or facts view: "holder (driver)", "device user (nvml)", "not named"."""
    if view["role"] == "holder":
        return "holder (%s)" % ", ".join("GPU %s: %s" % item for item in sorted(view["attribution"].items()))
    if view["role"] == "device_user":
        return "device user (%s)" % view["kind"]
    return "not named"


def summary(view, index):
    """describe() without GPU numbers, for the GPU under test `index`: "holder (driver)", "device user (nvml)"."""
    if view["role"] == "holder":
        return "holder (%s)" % view["attribution"].get(str(index), "other GPU")
    return describe(view)


def meets(view, expected, index):
    """Whether a view is what `expected` (CASES) asks on GPU `index`."""
    if view["role"] != expected["role"]:
        return False
    if expected["role"] == "holder":
        return view["attribution"].get(str(index)) == expected["attribution"]
    return view["kind"] == expected["kind"]


def judge(case, phase, record, rule, facts, index):
    """The checks for one process in one reading: [(name, ok, detail)].

    Always: gpu_facts agrees with the rule applied to the raw record (role, attribution, kind). In the case's
    deciding phase also: both meet the case's expectation.
    """
    checks = [
        (
            "%s (%s memory): gpu_facts agrees with the rule applied to /proc and the driver's lists" % (case, phase),
            facts["role"] == rule["role"]
            and facts["attribution"] == rule["attribution"]
            and facts["kind"] == rule["kind"],
            {"rule": describe(rule), "gpu_facts": describe(facts), "raw_kind": record["kind"]},
        )
    ]
    spec = dict((name, (what, deciding, expected)) for name, what, deciding, expected in CASES)
    what, deciding, expected = spec[case]
    if phase == deciding:
        checks.append(
            (
                "%s: %s is %s" % (case, what, describe_expected(expected)),
                meets(facts, expected, index),
                {"gpu_facts": describe(facts), "rule": describe(rule)},
            )
        )
    return checks


def describe_expected(expected):
    if expected["role"] == "holder":
        return "a holder (%s)" % expected["attribution"]
    return "a device user (%s), never a holder" % expected["kind"]


def short_files(paths, minors):
    """ "nvidia-uvm, nvidiactl + GPU 0" for device paths: /dev/nvidiaN named by the GPU index of minor N."""
    others, indices = set(), set()
    for path in paths:
        minor = minor_of(path)
        if minor is not None and minor in minors:
            indices.add(minors.index(minor))
        else:
            others.add(path[len("/dev/") :] if path.startswith("/dev/") else path)
    text = ", ".join(sorted(others))
    if indices:
        gpus = ("GPU %d" if len(indices) == 1 else "GPUs %s") % (
            next(iter(indices)) if len(indices) == 1 else ",".join(str(i) for i in sorted(indices))
        )
        text = "%s + %s" % (text, gpus) if text else gpus
    return text or "none"


def table_rows(scenario, minors):
    """Rows of the report's attribution table from the scenario's records:
    [case, process, device files open, device mappings, driver lists, rule, gpu_facts, expected, ok]."""
    rows = []
    readings = scenario.get("readings") or {}
    for case, what, deciding, expected in CASES:
        reading = (readings.get(deciding) or {}).get(case)
        if reading is None:
            rows.append([case, what, "–", "–", "–", "–", "–", describe_expected(expected), "not run"])
            continue
        record = reading["record"]
        mappings = (
            "%d (%s)" % (len(record["device_mappings"]), short_files(record["mapped"], minors))
            if record["device_mappings"]
            else "none"
        )
        lists = (
            "; ".join(
                "GPU %s %s %s MiB" % (key, "+".join(entry["lists"]), entry["used_mib"])
                for key, entry in sorted(record["driver"].items())
            )
            or "not listed"
        )
        rows.append(
            [
                case,
                what,
                short_files(record["device_fds"], minors),
                mappings,
                lists,
                describe(reading["rule"]),
                describe(reading["facts"]),
                describe_expected(expected),
                "yes" if reading["meets"] else "NO",
            ]
        )
    return rows


TABLE_COLUMNS = [
    "Case",
    "Process",
    "Device files open",
    "Device mappings",
    "Driver lists (GPU, list, MiB)",
    "Rule on the raw records",
    "gpu_facts",
    "Expected",
    "As expected",
]


def render_table(scenario, minors):
    """The attribution table in Markdown (one row per case)."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in table_rows(scenario, minors)]
    notes = other_readings(scenario)
    if notes:
        lines += [""] + ["- in the %s-memory reading, %s: gpu_facts %s, rule %s" % note for note in notes]
    return lines


def other_readings(scenario):
    """[(phase, case, gpu_facts, rule)] for the readings that do not decide a case, where gpu_facts says
    something else than in the deciding one (e.g. CUDA initialized without a context becomes a device-file
    holder while an inherited handle leaves memory unexplained: the rule cannot tell the two apart)."""
    readings = scenario.get("readings") or {}
    notes = []
    for case, _what, deciding, _expected in CASES:
        decided = (readings.get(deciding) or {}).get(case)
        for phase in sorted(readings):
            reading = readings[phase].get(case)
            if phase == deciding or reading is None:
                continue
            if decided is None or describe(reading["facts"]) != describe(decided["facts"]):
                notes.append((phase, case, describe(reading["facts"]), describe(reading["rule"])))
    return notes
