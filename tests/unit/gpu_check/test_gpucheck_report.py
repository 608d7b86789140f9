"""tests/gpu/gpucheck/report.py: observations, comparison with the simulator, knobs, Markdown table."""

import copy

import pytest

from gpucheck import attribution, report

GIB = 1 << 30


def holder(lists=("compute",), nbytes=GIB, listed_mib=1024, seen_in=("driver", "fd", "mapping"), role="hold", minor=3):
    return {
        "role": role,
        "bytes": nbytes,
        "lists": list(lists),
        "listed_mib": listed_mib,
        "seen_in": list(seen_in),
        "found_by_scan": "fd" in seen_in,
        "device_files": ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia%d" % minor]
        if nbytes or role == "inherited"
        else [],
    }


def latency(released, exited=0.01, unlisted=None):
    """A release timing; the driver lists the holder until its memory is released (unlisted: released)."""
    unlisted = released if unlisted is None else unlisted
    return {"status": "ok", "seconds": {"exited": exited, "unlisted": unlisted, "released": released}}


def attribution_scenario(minor=3, others=(5,), nvml_caps=(1, 2), cuinit_maps=True):
    """The attribution scenario's readings as check.py records them (four processes, two readings): the simulated
    processes of the check open and map as real ones do (workload.py PLANTS)."""
    minors = [minor] + list(others)
    own = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia%d" % minor]
    context = [
        "7f00-7f20 rw-s 00000000 00:05 9 /dev/nvidia%d" % minor,
        "7f20-7f21 -w-s 00000000 00:05 9 /dev/nvidia%d" % minor,
    ]
    doorbells = ["7e00-7e01 -w-s 00000000 00:05 9 /dev/nvidia%d" % minor] * 2 if cuinit_maps else []
    maps = {"context": context, "nvml_only": [], "inherited_child": context, "cuda_init": doorbells}
    fds = {
        "context": own,
        "nvml_only": ["/dev/nvidiactl", "/dev/nvidia-uvm"]
        + ["/dev/nvidia%d" % m for m in minors]
        + ["/dev/nvidia-caps/nvidia-cap%d" % n for n in nvml_caps],
        "inherited_child": own,
        "cuda_init": own,
    }
    pids = {"context": 10, "nvml_only": 20, "inherited_child": 30, "cuda_init": 40}
    readings = {}
    for phase, unexplained in (("explained", False), ("unexplained", True)):
        lists = {0: {10: {"lists": ["compute"], "used_mib": 1024}}, 1: {}}
        # After the parent's exit the driver lists the dead parent (PID 99) with the memory (docs/attribution.md rule 2).
        memory = {
            0: {"unexplained": False, "used_mib": 1024, "exited": [99] if unexplained else [], "reused": []},
            1: {"unexplained": False, "used_mib": 0, "exited": [], "reused": []},
        }
        readings[phase] = {}
        for case, pid in pids.items():
            if case == "inherited_child" and phase == "explained":
                continue
            seen = {"pid": pid, "fds": dict.fromkeys(fds[case], 1), "maps": maps[case]}
            rec = attribution.raw_record(seen, lists, minors)
            rule = attribution.by_rule(rec, memory)
            facts = dict(rule, gpus=[], device_gpus=[0], seen_in=["fd"])
            expected = next(spec for name, _w, _p, spec in attribution.CASES if name == case)
            readings[phase][case] = {
                "record": rec,
                "rule": rule,
                "facts": facts,
                "meets": attribution.meets(facts, expected, 0),
            }
    return {"status": "ok", "readings": readings}


def sim_like_result():
    """A check result as a simulated node with default knobs produces it (shape of check.py's result.json)."""
    return {
        "date": "2026-11-29T08:00:00+00:00",
        "status": "ok",
        "gpu": {
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_mib": 81559,
            "index": 0,
            "minor": 3,
            "all_minors": [3, 5],
            "mig_mode": {"current": 0, "pending": 0, "error": None},
        },
        "driver": {"driver_version": "580.95.05", "cuda_driver_version": 13000},
        "host": {"backend": "sim"},
        "scenarios": {
            "idle": {
                "status": "ok",
                "memory": {"used_mib": 0, "reserved_mib": 529, "used_v1_mib": 529, "total_mib": 81559},
                "nvml_client_device_files": [
                    "/dev/nvidiactl",
                    "/dev/nvidia3",
                    "/dev/nvidia5",
                    "/dev/nvidia-uvm",
                    "/dev/nvidia-caps/nvidia-cap1",
                    "/dev/nvidia-caps/nvidia-cap2",
                ],
            },
            "vllm_tree": {
                "status": "ok",
                "holders": {
                    "vllm": holder(lists=(), nbytes=0, listed_mib=None, seen_in=(), role="api"),
                    "vllm.engine": holder(lists=(), nbytes=0, listed_mib=None, seen_in=(), role="engine"),
                    "vllm.engine.tp0": holder(),
                    "vllm.engine.tp1": holder(),
                },
                "gpu_facts": {"unexplained_mib": 0},
                "gpu_kill": {"elapsed_s": 0.07},
                "gpu_wait": {"elapsed_s": 0.01},
            },
            "inherited": {
                "status": "ok",
                "holders": {
                    "inherit": holder(),
                    "inherit.child": holder(lists=(), nbytes=0, listed_mib=None, seen_in=("fd",), role="inherited"),
                },
                "after_parent_exit": {"memory_kept": True, "child_lists": [], "parent_lists": ["compute"]},
            },
            "sigterm_ignored": {"status": "ok", "holders": {"stubborn": holder()}},
            "attribution": attribution_scenario(),
            "nested_pidns": {"status": "ok", "holders": {"nested": holder()}, "driver_pid": "host"},
            "reused_pid": {"status": "ok", "reuse": {"pid": 99, "listed": True, "listed_mib": 1024}, "checks": []},
            "mps": {"status": "skipped", "reason": "simulated node: no MPS daemon"},
            "release_latency": {
                "status": "ok",
                "sizes": {"1": latency(0.51), "10": latency(0.503), "50": latency(0.512)},
            },
        },
    }


def real_like_result():
    """What a real GPU might report: several behaviours differ from the simulator."""
    result = sim_like_result()
    result["gpu"].update(
        name="NVIDIA H200",
        memory_total_mib=143771,
        minor=0,
        all_minors=[0],
        mig_mode={"current": None, "pending": None, "error": "Not Supported"},
    )
    # A non-root NVML client opens nvidia-cap2 only; a cuInit that mapped nothing would be called an NVML client.
    result["scenarios"]["attribution"] = attribution_scenario(minor=0, others=(), nvml_caps=(2,), cuinit_maps=False)
    result["host"]["backend"] = "torch"
    scenarios = result["scenarios"]
    scenarios["idle"]["memory"] = {"used_mib": 40, "reserved_mib": 1012, "used_v1_mib": 1052, "total_mib": 143771}
    scenarios["idle"]["nvml_client_device_files"] = ["/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm"]
    for scenario in ("vllm_tree", "inherited", "sigterm_ignored", "nested_pidns"):
        for item in scenarios[scenario]["holders"].values():
            item["device_files"] = [p.replace("nvidia3", "nvidia0") for p in item["device_files"]] + [
                "/dev/nvidia-uvm-tools"
            ]
            if item["listed_mib"]:
                item["listed_mib"] = 1024 + 510
    scenarios["inherited"]["after_parent_exit"]["parent_lists"] = ["compute"]  # as the simulator (the driver's source)
    scenarios["release_latency"]["sizes"] = {
        "1": latency(0.62, exited=0.6),
        "10": latency(1.9, exited=1.8),
        "50": {"status": "skipped", "reason": "does not fit"},
    }
    scenarios["mps"] = mps_scenario()
    scenarios["pinned_release"] = dict(latency(2.47, exited=4.85, unlisted=2.47), pinned_gib=32, checks=[])
    return result


def mps_scenario():
    """The MPS scenario's reading as a real H200 gives it: the client in the compute and the MPS list."""
    lists = {0: {556: {"lists": ["compute", "mps"], "used_mib": 1540}, 573: {"lists": ["compute"], "used_mib": 66}}}
    context = ["200600000-200800000 rw-s 00000000 00:06 142 /dev/nvidia0"]
    memory = {0: {"unexplained": False, "used_mib": 1614, "exited": [], "reused": []}}
    reading = {}
    for case, pid, maps in (("mps_client", 556, context), ("mps_server", 573, context), ("mps_control", 550, [])):
        rec = attribution.raw_record({"pid": pid, "fds": {"/dev/nvidia0": 3}, "maps": maps}, lists, [0])
        rule = attribution.by_rule(rec, memory)
        expected = next(e for c, _w, _p, e in attribution.SCENARIO_CASES["mps"] if c == case)
        reading[case] = {"record": rec, "rule": rule, "facts": rule, "meets": attribution.meets(rule, expected, 0)}
    failed = {"name": "gpu_facts counts the client's memory once", "ok": False, "detail": 3080}
    return {"status": "failed", "readings": {"serving": reading}, "checks": [failed]}


def test_a_simulated_node_shows_no_difference():
    obs = report.observations(sim_like_result())
    unmeasured = [item for item, value in obs.items() if value is None]
    assert unmeasured == list(report.NOT_ON_SIM)
    rows = report.compare(obs)
    assert len(rows) == len(report.SIMULATOR) - len(report.NOT_ON_SIM)
    assert [row["item"] for row in rows if not row["same"]] == []


def test_differences_name_what_the_real_driver_did():
    obs = report.observations(real_like_result())
    differing = {row["item"]: row for row in report.compare(obs) if not row["same"]}
    assert set(differing) == {
        "idle_used_mib",
        "reserved_mib",
        "context_overhead_mib",
        "holder_device_files",
        "release_s_10gib",
        "attribution_device_files",
        "attribution_maps_device",
        "attribution_gpu_facts",
        "mps_client_lists",
        "nvml_client_device_files",
    }
    assert differing["attribution_maps_device"]["real"] == {
        "context": True,
        "nvml_only": False,
        "inherited_child": True,
        "cuda_init": False,
    }
    assert differing["attribution_device_files"]["real"]["nvml_only"] == [
        "/dev/nvidia-caps/nvidia-cap2",
        "/dev/nvidia-uvm",
        "/dev/nvidia<minor>",
        "/dev/nvidiactl",
    ]
    assert differing["attribution_gpu_facts"]["real"] == {
        "context": "holder (driver)",
        "nvml_only": "device user (nvml)",
        "inherited_child": "holder (device_file)",
        "cuda_init": "device user (nvml)",
    }
    assert differing["mps_client_lists"]["real"] == ["compute", "mps"] and obs["mps_server_lists"] == ["compute"]
    assert differing["reserved_mib"]["real"] == 1012 and differing["reserved_mib"]["simulator"] == 529
    assert differing["context_overhead_mib"]["real"] == 510
    assert differing["holder_device_files"]["real"] == [
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia<minor>",
        "/dev/nvidiactl",
    ]
    assert obs["release_s_50gib"] is None  # skipped: not compared
    assert "release_s_50gib" not in {row["item"] for row in report.compare(obs)}
    assert obs["v1_used_includes_reserved"] is True and obs["reused_pid_listed"] is True


@pytest.mark.parametrize("released, same", [(0.74, True), (0.76, False), (0.26, True), (0.24, False)])
def test_latency_is_the_same_within_its_tolerance(released, same):
    result = sim_like_result()
    result["scenarios"]["release_latency"]["sizes"]["1"] = latency(released)
    row = next(r for r in report.compare(report.observations(result)) if r["item"] == "release_s_1gib")
    assert row["same"] is same


def test_a_failed_scenario_still_counts_but_an_errored_one_does_not():
    result = sim_like_result()
    result["scenarios"]["nested_pidns"].update(status="failed", driver_pid="namespace")
    assert report.observations(result)["nested_driver_pid"] == "namespace"
    result["scenarios"]["nested_pidns"]["status"] = "error"
    assert report.observations(result)["nested_driver_pid"] is None


def test_device_files_of_other_gpus_are_normalized():
    paths = ["/dev/nvidia0", "/dev/nvidia7", "/dev/nvidiactl", "/dev/nvidia-caps/nvidia-cap1"]
    assert report.normalize_device_files(paths, [0, 7]) == [
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia<minor>",
        "/dev/nvidiactl",
    ]
    assert report.normalize_device_files(paths, [0]) == [
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia7",
        "/dev/nvidia<minor>",
        "/dev/nvidiactl",
    ]


def test_suggested_knobs_match_the_gpu():
    knobs = report.suggested_sim_knobs(real_like_result())
    # release latency: the median of (released - exited) over the measured sizes
    assert knobs == {
        "model_name": "NVIDIA H200",
        "memory_mib": 143771,
        "reserved_mib": 1012,
        "idle_used_mib": 40,
        "release_latency": 0.06,
    }


def test_markdown_table_has_one_row_per_result_and_lists_differences():
    results = [sim_like_result(), real_like_result()]
    text = report.render_markdown(copy.deepcopy(results))
    lines = text.splitlines()
    assert lines[0].count("|") == len(report.COLUMNS) + 1 and lines[1].count("---|") == len(report.COLUMNS)
    rows = lines[2:4]
    assert all(row.count("|") == len(report.COLUMNS) + 1 for row in rows)
    assert (
        "| 2026-11-29 | NVIDIA H100 80GB HBM3 (81559 MiB) | 580.95.05 (CUDA 13000) | sim | 0 / 529 | 0 | 5/6 · 6/6 | "
        "not listed / kept | 4/4 | 0.51 / 0.50 / 0.51 | – | 0.07 + 0.01 | – · ok · skipped · – | 0 (ok) |" == rows[0]
    )
    assert (
        "| 40 / 1012 | 510 |" in rows[1]
        and "| 3/4 | 0.62 / 1.90 / – | 32 GiB: 2.47 / 2.47 / 4.85 | 0.07 + 0.01 | – · ok · failed · – | 10 (ok) |"
        in rows[1]
    )
    assert "- none" in lines[lines.index("Differences from the simulator, NVIDIA H100 80GB HBM3, 2026-11-29:") + 1]
    assert "- `reserved_mib`: real 1012, simulator 529" in text
    assert "reserved_mib=1012" in text
    assert (
        "NVIDIA H100 80GB HBM3, 2026-11-29: MIG mode: current disabled, pending disabled (nvmlDeviceGetMigMode)"
        in lines
    )
    assert "NVIDIA H200, 2026-11-29: MIG mode: not available (Not Supported)" in lines
    start = lines.index("Attribution (docs/attribution.md) of four real processes on GPU 0, NVIDIA H200, 2026-11-29:")
    table = lines[start + 2 : start + 8]
    assert table[0].startswith("| Case | Process | Device files open | Device mappings |") and len(table[2:]) == 4
    assert table[-1].startswith("| cuda_init |") and table[-1].endswith(
        "| nvidia-uvm, nvidiactl + GPU 0 | none | not listed | device user (nvml) | device user (nvml) | "
        "a device user (cuda), never a holder | NO |"
    )
    assert (
        "| context | a CUDA context on one GPU (cuMemAlloc / torch tensor) | nvidia-uvm, nvidiactl + GPU 0 | "
        "2: 1 rw-s GPU 0, 1 -w-s GPU 0 | GPU 0 compute 1024 MiB | holder (GPU 0: driver) | holder (GPU 0: driver) | "
        "a holder (driver) | yes |" in table
    )
    # The driver scenarios: a table of processes where they ran, their failed checks, else their status.
    start = lines.index("MPS with a private control daemon: client, server, daemon (`mps`): failed:")
    assert lines[start + 2].startswith("| Case | Process |") and lines[start + 4].startswith("| mps_client |")
    assert lines[start + 4].endswith(
        "| GPU 0 compute+mps 1540 MiB | holder (GPU 0: driver) | holder (GPU 0: driver) | a holder (driver) | yes |"
    )
    assert lines[start + 7] == "- failed: gpu_facts counts the client's memory once (3080)"
    assert (
        "MPS with a private control daemon: client, server, daemon (`mps`): skipped (simulated node: no MPS daemon)"
        in lines
    )


def test_mig_line():
    assert (
        report.mig_line({"current": 1, "pending": 0, "error": None})
        == "MIG mode: current enabled, pending disabled (nvmlDeviceGetMigMode)"
    )
    assert report.mig_line(None) == "MIG mode: not read"


def test_an_attribution_scenario_that_did_not_run_is_said_so_and_not_compared():
    result = sim_like_result()
    result["scenarios"]["attribution"] = {"status": "skipped", "reason": "not enough time left"}
    assert report.observations(result)["attribution_gpu_facts"] is None
    assert "Attribution: skipped (not enough time left)" in report.render_markdown([result])
