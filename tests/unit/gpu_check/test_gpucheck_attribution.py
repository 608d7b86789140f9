"""tests/gpu/gpucheck/attribution.py: raw records, the attribution rule (docs/attribution.md) applied to them,
gpu_facts' view, the checks comparing both, and the report's table."""

import pytest

from gpucheck import attribution

CTL, UVM = "/dev/nvidiactl", "/dev/nvidia-uvm"
MINORS = [3, 5]  # GPU 0 is /dev/nvidia3, GPU 1 /dev/nvidia5
CONTEXT_MAPS = ["7f00-7f01 rw-s 00000000 00:05 123 /dev/nvidiactl", "7f02-7f03 rw-s 00003000 00:05 124 /dev/nvidia3"]


def record(pid, fds, lists_by_gpu, maps=()):
    mapped = sorted({line.split(None, 5)[5] for line in maps})
    return attribution.raw_record(pid, fds, list(maps), mapped, lists_by_gpu)


@pytest.mark.parametrize(
    "fds, mapped, kind",
    [
        ([CTL, UVM, "/dev/nvidia3"], [], "cuda"),
        ([CTL, "/dev/nvidia3", "/dev/nvidia5"], [], "nvml"),
        ([CTL], ["/dev/nvidia3"], "cuda"),  # a device mapping is CUDA, NVML never maps
        ([CTL], ["/dev/nvidiactl"], "nvml"),  # the control device says nothing about CUDA
        ([], ["/dev/nvidia-uvm"], "cuda"),
        ([], [], None),
    ],
)
def test_raw_kind_follows_the_product_definition(fds, mapped, kind):
    assert attribution.raw_kind(fds, mapped) == kind


def test_raw_record_keeps_fds_mappings_and_every_gpu_listing_it():
    lists = {
        0: {10: {"lists": ["compute"], "used_mib": 1024}, 11: {"lists": ["compute"], "used_mib": 5}},
        1: {11: {"lists": ["graphics"], "used_mib": None}},
    }
    rec = record(10, ["/dev/nvidia3", CTL, UVM], lists, CONTEXT_MAPS)
    assert rec == {
        "pid": 10,
        "device_fds": ["/dev/nvidia-uvm", "/dev/nvidia3", CTL],
        "device_mappings": CONTEXT_MAPS,
        "mapped": ["/dev/nvidia3", CTL],
        "driver": {"0": {"lists": ["compute"], "used_mib": 1024}},
        "kind": "cuda",
    }
    assert record(11, [CTL], lists)["driver"] == {
        "0": {"lists": ["compute"], "used_mib": 5},
        "1": {"lists": ["graphics"], "used_mib": None},
    }
    assert record(12, [], lists)["driver"] == {} and record(12, [], lists)["kind"] is None


def test_memory_is_unexplained_beyond_the_tolerance_and_when_unknown():
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
    }
    assert memory[1]["unexplained"] is False and memory[1]["unexplained_mib"] is None  # an N/A entry explains it
    assert memory[2] == {"used_mib": 257, "listed_mib": 0, "unexplained_mib": 257, "unexplained": True, "exited": []}
    assert memory[3]["unexplained"] is True  # used unknown: nothing explains it
    # A listed PID that no longer exists is a creator that exited.
    assert attribution.gpu_memory(lists, {0: 1024}, 256, alive=lambda pid: pid != 10)[0]["exited"] == [10]


EXPLAINED = {
    0: {"unexplained": False, "used_mib": 1024, "exited": []},
    1: {"unexplained": False, "used_mib": 0, "exited": []},
}
# After the parent's exit: the driver lists the dead parent (PID 99) with the memory on GPU 0.
UNEXPLAINED = {
    0: {"unexplained": False, "used_mib": 2048, "exited": [99]},
    1: {"unexplained": False, "used_mib": 0, "exited": []},
}
# Memory outside the lists (no exited creator): rule 5 on drivers before 535.113.01 only.
OUTSIDE = {
    0: {"unexplained": True, "used_mib": 3072, "exited": []},
    1: {"unexplained": False, "used_mib": 0, "exited": []},
}
LISTED = {0: {10: {"lists": ["compute"], "used_mib": 1024}}, 1: {}}


def test_the_four_cases_by_the_rule():
    context = record(10, [CTL, UVM, "/dev/nvidia3"], LISTED)
    nvml = record(20, [CTL, "/dev/nvidia3", "/dev/nvidia5"], LISTED)
    child = record(30, [CTL, UVM, "/dev/nvidia3"], LISTED)
    cuinit = record(40, [CTL, UVM, "/dev/nvidia3"], LISTED)
    assert attribution.by_rule(context, EXPLAINED, MINORS) == {
        "role": "holder",
        "attribution": {"0": "driver"},
        "foreign": [],
        "kind": "cuda",
    }
    for memory in (EXPLAINED, UNEXPLAINED):  # an NVML-only client is never a holder
        assert attribution.by_rule(nvml, memory, MINORS) == {
            "role": "device_user",
            "attribution": {},
            "foreign": [],
            "kind": "nvml",
        }
    assert attribution.by_rule(child, UNEXPLAINED, MINORS)["attribution"] == {"0": "device_file"}
    assert attribution.by_rule(cuinit, EXPLAINED, MINORS) == {
        "role": "device_user",
        "attribution": {},
        "foreign": [],
        "kind": "cuda",
    }
    # Unexplained memory on GPU 0 makes any unlisted CUDA user of its file a holder: the rule cannot tell
    # a cuInit-only process from the inheriting child.
    assert attribution.by_rule(cuinit, UNEXPLAINED, MINORS)["attribution"] == {"0": "device_file"}
    # Memory outside the lists: another namespace's or leaked on a translating driver; rule 5 on older ones.
    assert attribution.by_rule(child, OUTSIDE, MINORS)["attribution"] == {}
    assert attribution.by_rule(child, OUTSIDE, MINORS, translating=False)["attribution"] == {"0": "device_file"}
    # A listed process is a driver holder only: never a device-file holder of another GPU.
    both = record(10, [CTL, UVM, "/dev/nvidia3", "/dev/nvidia5"], LISTED)
    assert attribution.by_rule(both, {0: {"unexplained": True}, 1: {"unexplained": True}}, MINORS)["attribution"] == {
        "0": "driver"
    }


def test_listed_without_the_device_file_is_foreign_and_an_mps_client_is_confirmed_by_nvidiactl():
    stranger = record(10, [CTL, UVM, "/dev/nvidia5"], LISTED)  # the driver's PID 10 is another process here
    assert attribution.by_rule(stranger, EXPLAINED, MINORS) == {
        "role": "device_user",
        "attribution": {},
        "foreign": [0],
        "kind": "cuda",
    }
    mps = record(50, [CTL, UVM], {0: {50: {"lists": ["mps"], "used_mib": 512}}, 1: {}})
    assert attribution.by_rule(mps, EXPLAINED, MINORS)["attribution"] == {"0": "driver"}
    assert attribution.by_rule(record(60, [], LISTED), EXPLAINED, MINORS)["role"] is None


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
    cuinit = record(40, [CTL, UVM, "/dev/nvidia3"], LISTED)
    rule = attribution.by_rule(cuinit, EXPLAINED, MINORS)
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
    rule = attribution.by_rule(cuinit, UNEXPLAINED, MINORS)
    checks = attribution.judge("cuda_init", "unexplained", cuinit, rule, holder, 0)
    assert len(checks) == 1 and checks[0][1] is True
    # An NVML client reported with the wrong kind fails both.
    nvml = record(20, [CTL, "/dev/nvidia3"], LISTED)
    wrong = {"role": "device_user", "attribution": {}, "kind": "cuda"}
    rule = attribution.by_rule(nvml, EXPLAINED, MINORS)
    assert [ok for _n, ok, _d in attribution.judge("nvml_only", "explained", nvml, rule, wrong, 0)] == [False, False]


def reading(rec, memory, facts, case):
    rule = attribution.by_rule(rec, memory, MINORS)
    expected = next(spec for name, _what, _phase, spec in attribution.CASES if name == case)
    return {"record": rec, "rule": rule, "facts": facts, "meets": attribution.meets(facts, expected, 0)}


def test_table_rows_show_raw_records_rule_and_facts_and_cases_not_run():
    context = record(10, [CTL, UVM, "/dev/nvidia3"], LISTED, CONTEXT_MAPS)
    cuinit = record(40, [CTL, UVM, "/dev/nvidia3"], LISTED)
    scenario = {
        "readings": {
            "explained": {
                "context": reading(context, EXPLAINED, attribution.facts_view(10, FACTS), "context"),
                "cuda_init": reading(
                    cuinit, EXPLAINED, {"role": "device_user", "attribution": {}, "kind": "cuda"}, "cuda_init"
                ),
            },
            "unexplained": {
                "cuda_init": reading(
                    cuinit,
                    UNEXPLAINED,
                    {"role": "holder", "attribution": {"0": "device_file"}, "kind": "cuda"},
                    "cuda_init",
                )
            },
        }
    }
    rows = {row[0]: row for row in attribution.table_rows(scenario, MINORS)}
    assert rows["context"][2:] == [
        "nvidia-uvm, nvidiactl + GPU 0",
        "2 (nvidiactl + GPU 0)",
        "GPU 0 compute 1024 MiB",
        "holder (GPU 0: driver)",
        "holder (GPU 0: driver)",
        "a holder (driver)",
        "yes",
    ]
    assert rows["cuda_init"][2:] == [
        "nvidia-uvm, nvidiactl + GPU 0",
        "none",
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
        "- in the unexplained-memory reading, cuda_init: gpu_facts holder (GPU 0: device_file), "
        "rule holder (GPU 0: device_file)"
    )


def test_a_case_that_misses_its_expectation_is_marked():
    nvml = record(20, [CTL, "/dev/nvidia3"], LISTED)
    scenario = {
        "readings": {
            "explained": {
                "nvml_only": reading(
                    nvml,
                    EXPLAINED,
                    {"role": "holder", "attribution": {"0": "device_file"}, "kind": "nvml"},
                    "nvml_only",
                )
            }
        }
    }
    row = next(row for row in attribution.table_rows(scenario, MINORS) if row[0] == "nvml_only")
    assert row[2] == "nvidiactl + GPU 0" and row[-1] == "NO"


def test_short_files_names_gpus_by_index():
    assert attribution.short_files([CTL, "/dev/nvidia5", "/dev/nvidia3"], MINORS) == "nvidiactl + GPUs 0,1"
    assert (
        attribution.short_files(["/dev/nvidia9", "/dev/nvidia-caps/nvidia-cap1"], MINORS)
        == "nvidia-caps/nvidia-cap1, nvidia9"
    )
    assert attribution.short_files([], MINORS) == "none"
