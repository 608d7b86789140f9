"""The fixed-seed run of generated worlds (tests/worlds/world.py): every decision of gpu_facts and gpu_kill (check
mode, a run, a second run), or of reset_gpus.yml and check_gpus.yml for about one world in ten, on random simulated
hosts, judged by the oracle (tests/worlds/oracle.py). About 60 s on
2 cores; `make worlds N=...` runs more (CONTRIBUTING.md)."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import HealthCheck, given, seed, settings

from worlds import world

WORLDS = 10


@pytest.fixture(scope="module")
def pool(node_namespaces):
    nodes = world.Pool("t-%d-worlds" % os.getpid())
    yield nodes
    nodes.close()


def test_generated_worlds_end_exactly_the_selected_holders(pool, tmp_path):
    seen = {"worlds": 0, "decisions": 0, "playbooks": 0}

    @seed(41)
    @settings(max_examples=WORLDS, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(world.worlds())
    def check(generated):
        decisions, violations, _seconds = world.decide(pool, generated, tmp_path)
        seen["worlds"] += 1
        seen["playbooks"] += generated["through"] == "playbook"
        seen["decisions"] += decisions
        assert violations == [], "world %r:\n%s" % (generated, "\n".join(violations))

    check()
    assert seen["worlds"] >= WORLDS and seen["decisions"] > 5 * WORLDS and seen["playbooks"] >= 1, seen


def test_a_failed_planting_stops_the_run_and_what_earlier_worlds_left_is_ended(pool):
    """A world that could not be planted is never judged (its manifest would be empty, and a judge of nothing finds
    nothing); a process an earlier world left without a manifest line is ended before the next world is planted."""
    node, described = pool.node({"gpus": 1, "mig": False})
    stray = node.spawn("import time\ntime.sleep(300)")
    spec = {"world": {"procs": [{"id": "p0", "kind": "no such kind"}], "sim_dir": world.SIM_DIR}, "node": described}
    spec["selection"] = {"options": {}}
    (node.run_dir / "world.json").write_text(json.dumps(spec))
    done = node.exec(
        str(world.VENV_PYTHON), str(world.WORLDS / "inside.py"), "/run/gpusim/world.json", "plant", check=False
    )
    assert done.returncode != 0 and "PlantingFailed: KeyError" in done.stderr, done
    assert node.exec("test", "-e", "/proc/%d" % stray, check=False).returncode != 0, "the stray process lives on"
