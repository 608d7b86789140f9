"""tests/gpu/gpucheck/attribution.py: raw records, the attribution rule (docs/attribution.md) applied to them,
gpu_facts' view, the checks comparing both, and the report's tables; replayed on the records of a real H200
(tests/fixtures/hardware/h200-580.159.04)."""

import json
import os

import pytest

from gpucheck import attribution

CTL, UVM = "/dev/nvidiactl", "/dev/nvidia-uvm"
MINORS = [3, 5]  # GPU 0 is /dev/nvidia3, GPU 1 /dev/nvidia5
# What real processes map (tests/fixtures/hardware/README.md, table 2), on a node where GPU 0 is /dev/nvidia3.
CONTEXT_MAPS = [
    "200600000-200800000 rw-s 00000000 00:06 142 /dev/nvidia3",
    "200800000-204000000 rw-s 00000000 00:06 141 /dev/nvidiactl",
    "204a00000-204c00000 rw-s 204a00000 00:06 143 /dev/nvidia-uvm",
    "7fc96fcda000-7fc96fcea000 -w-s 00000000 00:06 142 /dev/nvidia3",
]
CHILD_MAPS = [line for line in CONTEXT_MAPS if "nvidia-uvm" not in line]  # VM_DONTCOPY: not inherited
CUINIT_MAPS = [
    "7fc96fcda000-7fc96fcea000 -w-s 00000000 00:06 142 /dev/nvidia3",
    "7fc96fcea000-7fc96fcfa000 -w-s 00000000 00:06 142 /dev/nvidia3",
    "7fc976ec8000-7fc976ec9000 r--s 00000000 00:06 141 /dev/nvidiactl",
]
SMI_MAPS = ["7f78543b3000-7f78543b4000 r--s 00000000 00:06 141 /dev/nvidiactl"]
IDENTITIES = {3: ((0, 6), 142), 5: ((0, 6), 144)}
RECORDS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "fixtures",
    "hardware",
    "h200-580.159.04",
)
# On the H200 /dev/nvidia0 is inode 142 of devtmpfs 00:06 (its maps lines and fdinfo `ino`).
H200_MINORS, H200_IDENTITIES = [0], {0: ((0, 6), 142)}


def record(pid, fds, lists_by_gpu, maps=(), identities=None):
    seen = {"pid": pid, "fds": {path: 1 for path in fds}, "maps": list(maps)}
    return attribution.raw_record(seen, lists_by_gpu, MINORS, identities)


def load(name):
    with open(os.path.join(RECORDS, name)) as source:
        return json.load(source)


@pytest.mark.parametrize(
    "fds, mapped, kind",
    [
        ([CTL, UVM, "/dev/nvidia3"], [], "nvml"),  # UVM open says nothing: real NVML clients open it too
        ([CTL, "/dev/nvidia3", "/dev/nvidia5"], [], "nvml"),
        ([CTL], ["/dev/nvidia3"], "cuda"),  # a GPU file mapped: cuInit's doorbells or a context
        ([CTL], ["/dev/nvidiactl"], "nvml"),  # nvidia-smi maps nvidiactl read-only
        ([], ["/dev/nvidia-uvm"], "nvml"),
        ([], [], None),
    ],
)
def test_raw_kind_is_cuda_for_a_mapped_gpu_file(fds, mapped, kind):
    assert attribution.raw_kind(fds, mapped) == kind


def test_a_context_is_an_rw_s_mapping_of_the_gpu_file_matched_by_identity():
    assert attribution.context_gpus(CONTEXT_MAPS, MINORS, IDENTITIES) == [0]
    assert attribution.context_gpus(CONTEXT_MAPS, MINORS) == [0]  # no identity known: by path
    assert attribution.context_gpus(CUINIT_MAPS + SMI_MAPS, MINORS, IDENTITIES) == []  # -w-s and r--s are no context
    assert attribution.context_gpus(["7f00-7f20 rwxs 00000000 00:06 144 /dev/nvidia5"], MINORS, IDENTITIES) == [1]
    # A bind mount elsewhere is the same file; a file named /dev/nvidia3 that is another one is not.
    bound = ["7f00-7f20 rw-s 00000000 00:06 142 /run/nvidia/driver/dev/nvidia3"]
    assert attribution.context_gpus(bound, MINORS, IDENTITIES) == [0]
    other = ["7f00-7f20 rw-s 00000000 00:2a 7 /dev/nvidia3"]
    assert attribution.context_gpus(other, MINORS, IDENTITIES) == [] and attribution.context_gpus(other, MINORS) == [0]
    assert attribution.context_gpus(["7f00-7f20 rw-p 00000000 00:06 142 /dev/nvidia3"], MINORS, IDENTITIES) == []


def test_raw_record_keeps_fds_with_counts_mappings_contexts_and_every_gpu_listing_it():
    lists = {
        0: {10: {"lists": ["compute"], "used_mib": 1024}, 11: {"lists": ["compute", "mps"], "used_mib": 5}},
        1: {11: {"lists": ["graphics"], "used_mib": None}},
    }
    seen = {"pid": 10, "fds": {"/dev/nvidia3": 20, CTL: 2, UVM: 4}, "maps": CONTEXT_MAPS}
    assert attribution.raw_record(seen, lists, MINORS, IDENTITIES) == {
        "pid": 10,
        "device_fds": [UVM, "/dev/nvidia3", CTL],
        "fd_counts": {"/dev/nvidia3": 20, CTL: 2, UVM: 4},
        "device_mappings": CONTEXT_MAPS,
        "mapped": [UVM, "/dev/nvidia3", CTL],
        "contexts": [0],
        "driver": {"0": {"lists": ["compute"], "used_mib": 1024}},
        "kind": "cuda",
    }
    assert record(11, [CTL], lists)["driver"] == {
        "0": {"lists": ["compute", "mps"], "used_mib": 5},
        "1": {"lists": ["graphics"], "used_mib": None},
    }
    assert record(12, [], lists)["driver"] == {} and record(12, [], lists)["kind"] is None


def test_memory_is_unexplained_beyond_the_tolerance_and_numbers_are_exited_or_reused():
    lists = {
        0: {10: {"lists": ["compute"], "used_mib": 1024}},
        1: {11: {"lists": ["compute"], "used_mib": None}},
        2: {},
        3: {},
    }
    memory = attribution.gpu_memory(lists, {0: 1024 + 256, 1: 9000, 2: 257, 3: None}, 256)
    assert memory[0] == {
        "used_mib": 1280,
        "listed_mib": 1024,
        "unexplained_mib": 256,
        "unexplained": False,
        "exited": [],
        "reused": [],
    }
    assert memory[1]["unexplained"] is False and memory[1]["unexplained_mib"] is None  # an N/A entry explains it
    assert memory[2]["unexplained_mib"] == 257 and memory[2]["unexplained"] is True
    assert memory[3]["unexplained"] is True  # used unknown: nothing explains it
    # A listed PID that no longer exists is a creator that exited; one that exists without a context there, reused.
    assert attribution.gpu_memory(lists, {0: 1024}, 256, alive=lambda pid: pid != 10)[0]["exited"] == [10]
    reused = attribution.gpu_memory(lists, {0: 1024, 1: 0}, 256, shows_context=lambda pid, index: False)
    assert reused[0]["reused"] == [10] and reused[1]["reused"] == [11] and reused[0]["exited"] == []


EXPLAINED = {0: {"unexplained": False, "used_mib": 1024, "exited": [], "reused": []}, 1: {"used_mib": 0}}
# After the creator's exit: the driver lists the dead creator (PID 99) with the memory on GPU 0.
EXITED = {0: {"unexplained": False, "used_mib": 2048, "exited": [99], "reused": []}, 1: {"used_mib": 0}}
# The dead creator's number now names an NVML client (PID 99 again): listed, alive, without a context.
REUSED = {0: {"unexplained": False, "used_mib": 2048, "exited": [], "reused": [99]}, 1: {"used_mib": 0}}
# Memory outside the lists (no exited creator): another namespace's on a translating driver, else rule 5.
OUTSIDE = {0: {"unexplained": True, "used_mib": 3072, "exited": [], "reused": []}, 1: {"used_mib": 0}}
LISTED = {0: {10: {"lists": ["compute"], "used_mib": 1024}}, 1: {}}
REUSER_LISTED = {0: {99: {"lists": ["compute"], "used_mib": 2566}}, 1: {}}


def test_only_an_rw_s_mapping_of_the_gpu_file_makes_a_holder():
    context = record(10, [CTL, UVM, "/dev/nvidia3"], LISTED, CONTEXT_MAPS, IDENTITIES)
    nvml = record(20, [CTL, UVM, "/dev/nvidia3", "/dev/nvidia5", "/dev/nvidia-caps/nvidia-cap2"], LISTED)
    child = record(30, [CTL, UVM, "/dev/nvidia3"], LISTED, CHILD_MAPS, IDENTITIES)
    cuinit = record(40, [CTL, UVM, "/dev/nvidia3"], LISTED, CUINIT_MAPS, IDENTITIES)
    smi = record(50, [CTL, UVM, "/dev/nvidia3"], LISTED, SMI_MAPS, IDENTITIES)
    holder = {"role": "holder", "attribution": {"0": "driver"}, "foreign": [], "kind": "cuda"}
    assert attribution.by_rule(context, EXPLAINED) == holder
    for memory in (EXPLAINED, EXITED, REUSED, OUTSIDE):  # bystanders are never holders, whatever the memory
        for bystander, kind in ((nvml, "nvml"), (cuinit, "cuda"), (smi, "nvml")):
            assert attribution.by_rule(bystander, memory, translating=False) == {
                "role": "device_user",
                "attribution": {},
                "foreign": [],
                "kind": kind,
            }
    assert attribution.by_rule(child, EXPLAINED)["role"] == "device_user"  # the creator lives and explains it
    for memory in (EXITED, REUSED):
        assert attribution.by_rule(child, memory)["attribution"] == {"0": "device_file"}
    # Memory outside the lists: another namespace's or leaked on a translating driver; rule 5 on older ones.
    assert attribution.by_rule(child, OUTSIDE)["attribution"] == {}
    assert attribution.by_rule(child, OUTSIDE, translating=False)["attribution"] == {"0": "device_file"}
    unknown = {0: {"unexplained": True, "used_mib": None, "exited": [], "reused": []}}
    assert attribution.by_rule(child, unknown)["attribution"] == {"0": "device_file"}


def test_a_listed_number_without_a_context_is_foreign_and_never_a_holder():
    reuser = record(99, [CTL, UVM, "/dev/nvidia3"], REUSER_LISTED)
    assert attribution.by_rule(reuser, REUSED) == {
        "role": "device_user",
        "attribution": {},
        "foreign": [0],
        "kind": "nvml",
    }
    # An MPS client needs the same evidence as any context (nvidiactl alone no longer confirms it).
    mps_lists = {0: {50: {"lists": ["compute", "mps"], "used_mib": 1540}}, 1: {}}
    assert attribution.by_rule(record(50, [CTL, UVM], mps_lists), EXPLAINED)["foreign"] == [0]
    client = record(50, [CTL, UVM, "/dev/nvidia3"], mps_lists, CONTEXT_MAPS, IDENTITIES)
    assert attribution.by_rule(client, EXPLAINED)["attribution"] == {"0": "driver"}
    # A listed process is a driver holder only: never a device-file holder of another GPU.
    both = record(10, [CTL, "/dev/nvidia3", "/dev/nvidia5"], LISTED, CONTEXT_MAPS + [CONTEXT_MAPS[0][:-1] + "5"])
    assert attribution.by_rule(both, {0: EXITED[0], 1: {"exited": [7]}})["attribution"] == {"0": "driver"}
    assert attribution.by_rule(record(60, [], LISTED), EXPLAINED)["role"] is None


def replayed(rec, lists, memory):
    """A recorded process of the H200 as raw_record gives it, and the rule applied to it."""
    seen = {"pid": rec["pid"], "fds": rec["fds"], "maps": [line for line in rec["maps"] if "/dev/nvidia" in line]}
    raw = attribution.raw_record(seen, lists, H200_MINORS, H200_IDENTITIES)
    return raw, attribution.by_rule(raw, memory)


def test_the_h200_check_records_give_each_process_its_role():
    """gpucheck-result.json: the attribution scenario on the H200 (driver 580.159.04), both readings. Under the rule
    it ran with, the NVML client was a CUDA user and, with the dead parent's memory held, a holder (as the
    cuInit-only process); under this one both stay device users."""
    scenario = load("gpucheck-result.json")["scenarios"]["attribution"]
    expected = {
        "context": ("holder", {"0": "driver"}, "cuda"),
        "nvml_only": ("device_user", {}, "nvml"),
        "cuda_init": ("device_user", {}, "cuda"),
        "inherited_child": ("holder", {"0": "device_file"}, "cuda"),
    }
    for phase in ("explained", "unexplained"):
        memory = {0: dict(scenario["memory"][phase], reused=[])}
        for case, reading in scenario["readings"][phase].items():
            old = reading["record"]
            seen = {"pid": old["pid"], "fds": dict.fromkeys(old["device_fds"], 1), "maps": old["device_mappings"]}
            raw = attribution.raw_record(seen, {0: {}}, H200_MINORS, H200_IDENTITIES)
            raw["driver"] = old["driver"]
            rule = attribution.by_rule(raw, memory)
            assert (rule["role"], rule["attribution"], rule["kind"]) == expected[case], (phase, case, rule)


def test_the_h200_bystanders_beside_a_dead_creator_are_device_users():
    """probe2-bystanders.json: after the creator's SIGKILL only its child holds the context; an NVML client, a
    torch.cuda.is_available() process and nvidia-smi -l 1 map no GPU file read-write (maps: the first 40 lines
    naming nvidia, which include every /dev/nvidia* one of these processes)."""
    steps = {step["name"]: step["value"] for step in load("probe2-bystanders.json")["steps"]}
    pids = steps["pids"]
    lists = {0: {p["pid"]: {"lists": ["compute"], "used_mib": p["mib"]} for p in steps["after_kill.nvml"]["procs"]}}
    memory = {0: {"used_mib": 4740, "unexplained": False, "exited": [pids["dead_parent"]], "reused": []}}
    procs = dict(steps["before_kill.procs"], inherited_child=steps["after_kill.inherited_child"])
    roles = {}
    for name in ("ctx", "small_ctx", "nvml", "nvidia_smi_loop", "inherited_child"):
        _raw, rule = replayed(procs[name], lists, memory)
        roles[name] = (rule["role"], rule["attribution"])
    assert roles == {
        "ctx": ("holder", {"0": "driver"}),
        "small_ctx": ("holder", {"0": "driver"}),
        "nvml": ("device_user", {}),
        "nvidia_smi_loop": ("device_user", {}),
        "inherited_child": ("holder", {"0": "device_file"}),
    }


def test_the_h200_reused_number_is_a_device_user_and_the_mps_client_a_holder():
    """probe3: an NVML client got the dead creator's PID 435, which the driver lists with 2566 MiB; probe4: an MPS
    client, listed in the compute and the MPS list with 1540 MiB."""
    steps = {step["name"]: step["value"] for step in load("probe3-reuse-pinned.json")["steps"]}
    reuser = steps["reuse.reuser_proc"]
    lists = {0: {435: {"lists": ["compute"], "used_mib": 2566}}}
    memory = {0: {"used_mib": 2574, "unexplained": False, "exited": [], "reused": [435]}}
    raw, rule = replayed(reuser, lists, memory)
    assert raw["pid"] == 435 and (rule["role"], rule["attribution"], rule["foreign"]) == ("device_user", {}, [0])
    mps = {step["name"]: step["value"] for step in load("probe4-ipc-mps.json")["steps"]}
    client = mps["mps.procs"]["556"]
    lists = {0: {556: {"lists": ["compute", "mps"], "used_mib": 1540}, 573: {"lists": ["compute"], "used_mib": 66}}}
    _raw, rule = replayed(client, lists, {0: {"used_mib": 1614, "unexplained": False, "exited": [], "reused": []}})
    assert rule["attribution"] == {"0": "driver"}


FACTS = {
    "holders": [
        {
            "pid": 10,
            "gpus": [0],
            "device_gpus": [0],
            "attribution": {"0": "driver"},
            "kind": "cuda",
            "seen_in": ["driver", "fd"],
        }
    ],
    "device_users": [{"pid": 20, "device_gpus": [0, 1], "kind": "nvml", "seen_in": ["fd"]}],
}


def test_facts_view_reads_holders_and_device_users():
    assert attribution.facts_view(10, FACTS) == {
        "role": "holder",
        "attribution": {"0": "driver"},
        "kind": "cuda",
        "gpus": [0],
        "device_gpus": [0],
        "seen_in": ["driver", "fd"],
    }
    assert (
        attribution.facts_view(20, FACTS)["role"] == "device_user"
        and attribution.facts_view(20, FACTS)["kind"] == "nvml"
    )
    assert attribution.facts_view(99, FACTS)["role"] is None
    assert attribution.describe(attribution.facts_view(10, FACTS)) == "holder (GPU 0: driver)"
    assert attribution.describe(attribution.facts_view(20, FACTS)) == "device user (nvml)"
    assert attribution.describe(attribution.facts_view(99, FACTS)) == "not named"
    assert attribution.summary(attribution.facts_view(10, FACTS), 0) == "holder (driver)"


def test_judge_checks_agreement_always_and_the_expectation_in_the_deciding_reading():
    cuinit = record(40, [CTL, UVM, "/dev/nvidia3"], LISTED, CUINIT_MAPS)
    rule = attribution.by_rule(cuinit, EXPLAINED)
    user = {"role": "device_user", "attribution": {}, "kind": "cuda"}
    checks = attribution.judge("cuda_init", "explained", cuinit, rule, user, 0)
    assert [(name.split(":")[0], ok) for name, ok, _detail in checks] == [
        ("cuda_init (explained memory)", True),
        ("cuda_init", True),
    ]
    # gpu_facts calling it a holder disagrees with the rule and with the expectation.
    holder = {"role": "holder", "attribution": {"0": "device_file"}, "kind": "cuda"}
    assert [ok for _name, ok, _detail in attribution.judge("cuda_init", "explained", cuinit, rule, holder, 0)] == [
        False,
        False,
    ]
    # In the other reading only the agreement is checked.
    checks = attribution.judge("cuda_init", "unexplained", cuinit, attribution.by_rule(cuinit, EXITED), user, 0)
    assert len(checks) == 1 and checks[0][1] is True
    # An NVML client reported with the wrong kind fails both.
    nvml = record(20, [CTL, "/dev/nvidia3"], LISTED)
    wrong = {"role": "device_user", "attribution": {}, "kind": "cuda"}
    rule = attribution.by_rule(nvml, EXPLAINED)
    assert [ok for _n, ok, _d in attribution.judge("nvml_only", "explained", nvml, rule, wrong, 0)] == [False, False]
    # Another scenario's cases: nvidia-smi in the dead creator's reading.
    cases = attribution.SCENARIO_CASES["dead_creator"]
    smi = record(50, [CTL, UVM, "/dev/nvidia3"], LISTED, SMI_MAPS)
    view = {"role": "device_user", "attribution": {}, "kind": "nvml"}
    checks = attribution.judge("nvidia_smi", "after_exit", smi, attribution.by_rule(smi, EXITED), view, 0, cases)
    assert [ok for _n, ok, _d in checks] == [True, True] and "nvidia-smi -l 1 is a device user (nvml)" in checks[1][0]


def reading(rec, memory, facts, case, cases=attribution.CASES):
    rule = attribution.by_rule(rec, memory)
    expected = next(spec for name, _what, _phase, spec in cases if name == case)
    return {"record": rec, "rule": rule, "facts": facts, "meets": attribution.meets(facts, expected, 0)}


def test_table_rows_show_raw_records_rule_and_facts_and_cases_not_run():
    context = record(10, [CTL, UVM, "/dev/nvidia3"], LISTED, CONTEXT_MAPS)
    cuinit = record(40, [CTL, UVM, "/dev/nvidia3"], LISTED, CUINIT_MAPS)
    user = {"role": "device_user", "attribution": {}, "kind": "cuda"}
    scenario = {
        "readings": {
            "explained": {
                "context": reading(context, EXPLAINED, attribution.facts_view(10, FACTS), "context"),
                "cuda_init": reading(cuinit, EXPLAINED, user, "cuda_init"),
            },
            "unexplained": {
                "cuda_init": reading(
                    cuinit, EXITED, {"role": "holder", "attribution": {"0": "device_file"}, "kind": "cuda"}, "cuda_init"
                )
            },
        }
    }
    rows = {row[0]: row for row in attribution.table_rows(scenario, MINORS)}
    assert rows["context"][2:] == [
        "nvidia-uvm, nvidiactl + GPU 0",
        "4: 1 rw-s GPU 0, 1 rw-s nvidiactl, 1 rw-s nvidia-uvm, 1 -w-s GPU 0",
        "GPU 0 compute 1024 MiB",
        "holder (GPU 0: driver)",
        "holder (GPU 0: driver)",
        "a holder (driver)",
        "yes",
    ]
    assert rows["cuda_init"][2:] == [
        "nvidia-uvm, nvidiactl + GPU 0",
        "3: 2 -w-s GPU 0, 1 r--s nvidiactl",
        "not listed",
        "device user (cuda)",
        "device user (cuda)",
        "a device user (cuda), never a holder",
        "yes",
    ]
    assert rows["nvml_only"][2:] == ["–", "–", "–", "–", "–", "a device user (nvml), never a holder", "not run"]
    assert rows["inherited_child"][-1] == "not run"
    lines = attribution.render_table(scenario, MINORS)
    assert lines[0].count("|") == len(attribution.TABLE_COLUMNS) + 1 and len(lines) == 2 + 4 + 2
    assert lines[-1] == (
        "- in the unexplained-memory reading, cuda_init: gpu_facts holder (GPU 0: device_file), rule device user (cuda)"
    )
    # A case a scenario could not run says why.
    cases = attribution.SCENARIO_CASES["dead_creator"]
    rows = attribution.table_rows({"readings": {}, "not_run": {"nvidia_smi": "nvidia-smi not found"}}, MINORS, cases)
    assert rows[-1][0] == "nvidia_smi" and rows[-1][-1] == "not run (nvidia-smi not found)"


def test_a_case_that_misses_its_expectation_is_marked():
    nvml = record(20, [CTL, "/dev/nvidia3"], LISTED)
    holder = {"role": "holder", "attribution": {"0": "device_file"}, "kind": "nvml"}
    scenario = {"readings": {"explained": {"nvml_only": reading(nvml, EXPLAINED, holder, "nvml_only")}}}
    row = next(row for row in attribution.table_rows(scenario, MINORS) if row[0] == "nvml_only")
    assert row[2] == "nvidiactl + GPU 0" and row[3] == "none" and row[-1] == "NO"


def test_short_files_names_gpus_by_index():
    assert attribution.short_files([CTL, "/dev/nvidia5", "/dev/nvidia3"], MINORS) == "nvidiactl + GPUs 0,1"
    assert (
        attribution.short_files(["/dev/nvidia9", "/dev/nvidia-caps/nvidia-cap1"], MINORS)
        == "nvidia-caps/nvidia-cap1, nvidia9"
    )
    assert attribution.short_files([], MINORS) == "none"


def test_every_scenario_case_expects_a_role_the_rule_can_give():
    for name, cases in attribution.SCENARIO_CASES.items():
        assert len({case for case, _w, _p, _e in cases}) == len(cases), name
        for _case, what, _phase, expected in cases:
            assert what and expected["role"] in ("holder", "device_user")
            assert expected.get("attribution") in ("driver", "device_file") or expected.get("kind") in ("cuda", "nvml")
