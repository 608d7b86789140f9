"""tests/gpu/check.py's command line and tests/gpu/run.sh, without a GPU."""

import json
import os
import subprocess

import pytest

import check
from gpucheck import driver

RUN_SH = os.path.join(check.HERE, "run.sh")


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(check.driver, "probe", lambda: (False, "libnvidia-ml.so.1 cannot be loaded (test)"))


@pytest.fixture
def one_gpu(monkeypatch):
    monkeypatch.setattr(check.driver, "probe", lambda: (True, "1 GPU(s)"))


def test_without_a_gpu_the_check_is_skipped(no_gpu, capsys):
    assert check.main(["--out", "/nonexistent"]) == check.EXIT_SKIPPED == 2
    assert capsys.readouterr().out == "skipped: no NVIDIA GPU (libnvidia-ml.so.1 cannot be loaded (test))\n"
    assert check.main(["--probe"]) == 2


def test_probe_with_a_gpu(one_gpu, capsys):
    assert check.main(["--probe"]) == 0
    assert capsys.readouterr().out == "ok: 1 GPU(s)\n"


def test_missing_required_packages_stop_the_check(one_gpu, monkeypatch, capsys):
    monkeypatch.setattr(check, "missing_packages", lambda: ["nvidia-ml-py", "setproctitle"])
    assert check.main([]) == check.EXIT_MISSING
    assert capsys.readouterr().out.startswith("error: missing Python packages: nvidia-ml-py (run tests/gpu/run.sh")


def test_missing_packages_names_pip_requirements(monkeypatch):
    real_find_spec = check.importlib.util.find_spec
    monkeypatch.setattr(
        check.importlib.util,
        "find_spec",
        lambda name: None if name in ("psutil", "setproctitle") else real_find_spec(name),
    )
    import ansible.release

    monkeypatch.setattr(ansible.release, "__version__", "2.16.14")
    assert check.missing_packages() == ["psutil", "setproctitle", "ansible-core"]
    monkeypatch.setattr(ansible.release, "__version__", "2.17.0")
    assert check.missing_packages() == ["psutil", "setproctitle"]


def test_sim_backend_needs_a_simulated_node(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSIM_RUN", str(tmp_path))
    backend, reason = check.choose_backend("sim")
    assert backend is None and str(tmp_path) in reason
    (tmp_path / "node.conf").write_text("gpus=1\n")
    assert check.choose_backend("sim") == ("sim", None)


def test_sizes_are_parsed():
    assert check.parse_args(["--sizes-gib", "1, 10,50"]).sizes_gib == [1, 10, 50]
    assert check.parse_args([]).sizes_gib == [1, 10, 50]


def test_render_md_prints_the_table(tmp_path, capsys):
    result = {
        "date": "2026-11-29T08:00:00+00:00",
        "status": "failed",
        "gpu": {"name": "NVIDIA H200", "memory_total_mib": 143771},
        "driver": {"driver_version": "580.159.04", "cuda_driver_version": 13000},
        "host": {"backend": "cuda"},
        "scenarios": {"idle": {"status": "error", "reason": "x"}},
        "differences": [],
    }
    path = tmp_path / "result.json"
    path.write_text(json.dumps(result))
    assert check.main(["--render-md", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| 2026-11-29 | NVIDIA H200 (143771 MiB) | 580.159.04 (CUDA 13000) | cuda | – |" in out
    assert out.rstrip().endswith("- simulator knobs matching this GPU: memory_mib=143771, model_name=NVIDIA H200")


def test_run_sh_without_a_gpu_exits_2():
    usable, _reason = driver.probe()
    if usable:
        pytest.skip("this host has an NVIDIA GPU")
    proc = subprocess.run([RUN_SH], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc
    assert proc.stdout.startswith("skipped: no NVIDIA GPU (")
