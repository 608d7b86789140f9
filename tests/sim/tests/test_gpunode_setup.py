"""tests/sim/gpunode up before `make setup` (issue 46, item 11): it says what to run first and makes no node."""

from __future__ import annotations

from simnode import gpunode


def test_up_without_the_venv_says_to_run_make_setup_first(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpunode, "VENV_PYTHON", tmp_path / "no-venv" / "bin" / "python")
    monkeypatch.setenv("GPUNODE_ROOT", str(tmp_path / "nodes"))
    try:
        assert gpunode.main(["up", "early", "--gpus", "1"]) == 1
        assert "run `make setup` first" in capsys.readouterr().err
        assert not (tmp_path / "nodes" / "early").exists()
    finally:
        if (tmp_path / "nodes" / "early").exists():  # made before the refusal existed: this test's own node
            gpunode.main(["down", "early"])
