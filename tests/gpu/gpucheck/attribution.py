# Copyright (c) 2026, gpuops.nvidia contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The attribution rule (docs/attribution.md) checked against raw records of real processes.

For each process the check starts in the attribution scenarios it records, independently of the
collection: the /dev/nvidia* files it holds open (with how many fds each), its /proc/PID/maps lines
of /dev/nvidia* files, and the driver's process lists of every GPU that show it (NVML, with used MiB).
`by_rule` applies docs/attribution.md to those records and the GPUs' memory; `facts_view` reads what
gpu_facts (run through ansible-playbook) made of the same process; `judge` compares both and the
expectation for each case. Pure functions of plain data (check.py reads /proc and NVML).

The rule, as a real H200 with driver 580.159.04 shows it (tests/fixtures/hardware/README.md): a process has a
context on GPU i only when it maps GPU i's /dev/nvidiaN read-write and shared (`rw-s` in /proc/PID/maps), the file
matched by its identity (device and inode). NVML clients map nothing, `nvidia-smi` maps nvidiactl read-only, a
process that only initialized CUDA maps the GPU's file write-only (`-w-s`): none of them ever shows it. Every
context seen (creator, forked child, MPS client and server, IPC importer) does.
"""

from __future__ import annotations

import re

from gpucheck.procs import maps_fields

_MINOR_RE = re.compile(r"^/dev/nvidia(\d+)$")

HOLDER_DRIVER = {"role": "holder", "attribution": "driver"}
HOLDER_DEVICE_FILE = {"role": "holder", "attribution": "device_file"}
NVML_USER = {"role": "device_user", "kind": "nvml"}
CUDA_USER = {"role": "device_user", "kind": "cuda"}

# The processes of the `attribution` scenario, what each is, and what docs/attribution.md says gpu_facts must make of
# it. expected: {"role": "holder" | "device_user", "attribution": "driver" | "device_file" (holders, on the GPU under
# test), "kind": "cuda" | "nvml" (device users)}. phase: the reading that decides the case ("explained": only listed
# holders keep memory; "unexplained": after the parent's exit its forked child keeps the parent's context, which the
# driver lists under the dead parent's PID (docs/attribution.md rule 2)).
CASES = (
    ("context", "a CUDA context on one GPU (cuMemAlloc / torch tensor)", "explained", HOLDER_DRIVER),
    ("nvml_only", "an NVML-only client (pynvml nvmlInit, stays initialized)", "explained", NVML_USER),
    (
        "inherited_child",
        "a forked child of a CUDA process, after the parent's exit (inherited handles)",
        "unexplained",
        HOLDER_DEVICE_FILE,
    ),
    ("cuda_init", "CUDA initialized without a context (cuInit only)", "explained", CUDA_USER),
)
CASE_NAMES = tuple(case[0] for case in CASES)


def dead_creators_child(phase):
    """The case of a forked child holding the context of its SIGKILLed creator, decided in reading `phase`."""
    return (
        "inherited_child",
        "a forked child holding the context of its SIGKILLed creator (inherited handles)",
        phase,
        HOLDER_DEVICE_FILE,
    )


# The other scenarios' processes, in the same form (check.py; tests/gpu/README.md).
SCENARIO_CASES = {
    "attribution": CASES,
    "dead_creator": (
        dead_creators_child("after_exit"),
        ("nvml_only", "an NVML-only client (pynvml nvmlInit, stays initialized)", "after_exit", NVML_USER),
        (
            "torch_available",
            "torch.cuda.is_available() (cuInit where PyTorch is missing), stays",
            "after_exit",
            CUDA_USER,
        ),
        ("nvidia_smi", "nvidia-smi -l 1", "after_exit", NVML_USER),
    ),
    "reused_pid": (
        dead_creators_child("reused"),
        ("reuser", "an NVML-only client that got the dead creator's PID number", "reused", NVML_USER),
    ),
    "mps": (
        ("mps_client", "an MPS client of a private MPS control daemon", "serving", HOLDER_DRIVER),
        ("mps_server", "the MPS server (nvidia-cuda-mps-server)", "serving", HOLDER_DRIVER),
        ("mps_control", "the MPS control daemon (nvidia-cuda-mps-control -f)", "serving", CUDA_USER),
    ),
    "ipc": (
        ("exporter", "a CUDA IPC exporter (cuMemAlloc, cuIpcGetMemHandle)", "both_alive", HOLDER_DRIVER),
        ("importer", "the importer (cuIpcOpenMemHandle), after the exporter's SIGKILL", "exporter_gone", HOLDER_DRIVER),
    ),
}


def minor_of(path):
    """N of /dev/nvidiaN, else None (nvidiactl, nvidia-uvm, nvidia-caps/...)."""
    match = _MINOR_RE.match(path)
    return int(match.group(1)) if match else None


def raw_kind(device_fds, mapped):
    """What docs/attribution.md calls the process from its files alone: "cuda" (it maps a GPU's /dev/nvidiaN in any
    way: cuInit's write-only doorbells, a context), "nvml" (device files only, or nvidiactl mapped: NVML clients and
    nvidia-smi; both keep /dev/nvidia-uvm open on a real driver, so UVM says nothing), None (no device file)."""
    if any(minor_of(path) is not None for path in mapped):
        return "cuda"
    return "nvml" if device_fds or mapped else None


def shared_rw(perms):
    """Whether maps permissions ("rw-s") are read-write and shared."""
    return perms[:2] == "rw" and perms[3:4] == "s"


def context_gpus(mapping_lines, minors, identities=None):
    """Indices (into `minors`, NVML order) of the GPUs on which these /proc/PID/maps lines show a context: an `rw-s`
    mapping of the GPU's /dev/nvidiaN. identities: {minor: ((major, minor), inode)} of each /dev/nvidiaN, as
    procs.file_identity gives them: where known the file is matched by identity (a bind mount elsewhere is the same
    device), else by path."""
    identities = identities or {}
    found = set()
    for line in mapping_lines:
        fields = maps_fields(line)
        if fields is None or not shared_rw(fields[0]):
            continue
        for index, minor in enumerate(minors):
            identity = identities.get(minor)
            if (fields[1], fields[2]) == identity if identity else fields[3] == "/dev/nvidia%d" % minor:
                found.add(index)
    return sorted(found)


def raw_record(seen, lists_by_gpu, minors, identities=None):
    """One process's raw record from procs.device_record() `seen`: {"pid", "device_fds" (sorted paths), "fd_counts",
    "device_mappings" (maps lines), "mapped" (their paths), "contexts" (context_gpus), "driver" ({"<index>": {"lists",
    "used_mib"}} for the GPUs whose lists show it), "kind" (raw_kind)}.

    lists_by_gpu: {index: {pid: {"lists", "used_mib"}}} (driver.Gpu.all_processes()).
    """
    pid, lines = seen["pid"], list(seen["maps"])
    mapped = sorted({line.split(None, 5)[5] for line in lines})
    driver = {str(index): dict(listed[pid]) for index, listed in sorted(lists_by_gpu.items()) if pid in listed}
    return {
        "pid": pid,
        "device_fds": sorted(seen["fds"]),
        "fd_counts": dict(seen["fds"]),
        "device_mappings": lines,
        "mapped": mapped,
        "contexts": context_gpus(lines, minors, identities),
        "driver": driver,
        "kind": raw_kind(seen["fds"], mapped),
    }


def gpu_memory(lists_by_gpu, used_mib_by_gpu, tolerance_mib, alive=None, shows_context=None):
    """{index: {"used_mib", "listed_mib", "unexplained_mib", "unexplained" (counts, as docs/attribution.md rule 4),
    "exited" (listed PIDs for which alive(pid) is false: creators that exited), "reused" (listed PIDs alive but
    without a context there, shows_context(pid, index) false: another process got the number)}}.

    used_mib_by_gpu: {index: NVML used MiB (v2 where present) or None}. A PID's memory counts once however many lists
    name it (driver.Gpu.processes reads one figure per PID).
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
        living = [pid for pid in listed if alive is None or alive(pid)]
        gpus[index] = {
            "used_mib": used,
            "listed_mib": total,
            "unexplained_mib": unexplained,
            "unexplained": counts,
            "exited": sorted(set(listed) - set(living)),
            "reused": sorted(pid for pid in living if shows_context is not None and not shows_context(pid, index)),
        }
    return gpus


def by_rule(record, memory, translating=True):
    """docs/attribution.md applied to one raw record: {"role": "holder" | "device_user" | None, "attribution"
    ({"<index>": "driver" | "device_file"}), "foreign" (indices whose lists show it while it shows no context there:
    a reused number, never a holder), "kind"}.

    A listed process holds a GPU on which it shows a context (`driver`). One that no list names holds a GPU on which
    it shows a context where a listed creator has exited or lost its number to another process, or where memory no
    list explains may be this namespace's (translating false: drivers before 535.113.01; memory unknown)
    (`device_file`). memory: gpu_memory().
    """
    contexts = set(record["contexts"])
    attribution, foreign = {}, []
    for key in record["driver"]:
        if int(key) in contexts:
            attribution[key] = "driver"
        else:
            foreign.append(int(key))
    if not attribution:
        for index in sorted(contexts):
            gpu = memory.get(index, {})
            unknown = "used_mib" in gpu and gpu["used_mib"] is None
            orphaned = gpu.get("exited") or gpu.get("reused")
            if orphaned or (gpu.get("unexplained") and (not translating or unknown)):
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


def judge(case, phase, record, rule, facts, index, cases=CASES):
    """The checks for one process in one reading: [(name, ok, detail)].

    Always: gpu_facts agrees with the rule applied to the raw record (role, attribution, kind). In the case's
    deciding phase (`cases`: CASES or one of SCENARIO_CASES) also: both meet the case's expectation.
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
    spec = dict((name, (what, deciding, expected)) for name, what, deciding, expected in cases)
    what, deciding, expected = spec[case]
    if phase == deciding:
        checks.append(
            (
                "%s: %s is %s" % (case, what, describe_expected(expected)),
                meets(facts, expected, index) and meets(rule, expected, index),
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


def short_mappings(record, minors):
    """ "31: 1 rw-s GPU 0, 26 rw-s nvidiactl, 1 rw-s nvidia-uvm, 1 -w-s GPU 0" for a raw record's maps lines: how
    many mappings of each permission and file (GPU files named by index), or "none"."""
    counts = {}
    for line in record["device_mappings"]:
        fields = maps_fields(line)
        if fields is None:
            continue
        key = (fields[0], short_files([fields[3]], minors))
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return "none"
    parts = ["%d %s %s" % (n, perms, name) for (perms, name), n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return "%d: %s" % (sum(counts.values()), ", ".join(parts))


def table_rows(scenario, minors, cases=CASES):
    """Rows of the report's table of a scenario's processes from its records: [case, process, device files open,
    device mappings, driver lists, rule, gpu_facts, expected, ok]. A case the scenario did not run says why."""
    rows = []
    readings = scenario.get("readings") or {}
    not_run = scenario.get("not_run") or {}
    for case, what, deciding, expected in cases:
        reading = (readings.get(deciding) or {}).get(case)
        if reading is None:
            why = "not run (%s)" % not_run[case] if case in not_run else "not run"
            rows.append([case, what, "–", "–", "–", "–", "–", describe_expected(expected), why])
            continue
        record = reading["record"]
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
                short_mappings(record, minors),
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


def render_table(scenario, minors, cases=CASES):
    """A scenario's table of processes in Markdown (one row per case)."""
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in table_rows(scenario, minors, cases)]
    notes = other_readings(scenario, cases)
    if notes:
        lines += [""] + ["- in the %s reading, %s: gpu_facts %s, rule %s" % note for note in notes]
    return lines


def other_readings(scenario, cases=CASES):
    """[(phase, case, gpu_facts, rule)] for the readings that do not decide a case, where gpu_facts says
    something else than in the deciding one (a case read again while memory is explained otherwise)."""
    readings = scenario.get("readings") or {}
    notes = []
    for case, _what, deciding, _expected in cases:
        decided = (readings.get(deciding) or {}).get(case)
        for phase in sorted(readings):
            reading = readings[phase].get(case)
            if phase == deciding or reading is None:
                continue
            if decided is None or describe(reading["facts"]) != describe(decided["facts"]):
                notes.append((phase_name(phase), case, describe(reading["facts"]), describe(reading["rule"])))
    return notes


def phase_name(phase):
    """How a reading is named in the report: "explained" -> "explained-memory" (the attribution scenario's)."""
    return "%s-memory" % phase if phase in ("explained", "unexplained") else phase
