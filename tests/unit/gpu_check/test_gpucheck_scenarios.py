"""tests/gpu/gpucheck/scenarios.py: its pure parts (programs, check_gpus' line, finding our MPS server)."""

import os

from gpucheck import scenarios


def fake(proc, pid, ppid, argv, environ=b""):
    """/proc/PID/{stat,cmdline,environ} of a fake process."""
    base = proc / str(pid)
    base.mkdir()
    fields = ["S", str(ppid)] + ["0"] * 17 + ["100"] + ["0"] * 10
    (base / "stat").write_text("%d (%s) %s\n" % (pid, os.path.basename(argv[0])[:15], " ".join(fields)))
    (base / "cmdline").write_bytes(b"\0".join(arg.encode() for arg in argv) + b"\0")
    (base / "environ").write_bytes(environ)


def test_programs_are_found_on_path_then_in_nvidias_directories(tmp_path):
    bin_dir, nvidia_dir = tmp_path / "bin", tmp_path / "nvidia"
    for directory in (bin_dir, nvidia_dir):
        directory.mkdir()
    program = nvidia_dir / "nvidia-cuda-mps-control"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    assert scenarios.find_program("nvidia-cuda-mps-control", path=str(bin_dir), dirs=[str(nvidia_dir)]) == str(program)
    assert scenarios.find_program("nvidia-smi", path=str(bin_dir), dirs=[str(nvidia_dir)]) is None
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    assert scenarios.find_program("nvidia-smi", path=str(bin_dir), dirs=[]) == str(bin_dir / "nvidia-smi")


def test_check_gpus_line_is_the_hosts_line():
    output = (
        'ok: [localhost] => {"msg": ["check_gpus localhost: not free: GPU 0: 2574 MiB used, held by PID 611 python3 '
        '(state S)", "check_gpus summary: 1 host(s): 1 not free (localhost)"]}'
    )
    assert scenarios.check_gpus_line(output) == (
        "check_gpus localhost: not free: GPU 0: 2574 MiB used, held by PID 611 python3 (state S)"
    )
    assert scenarios.check_gpus_line("PLAY RECAP") is None


def test_our_mps_server_is_the_daemons_child_else_the_one_with_our_pipe_directory(tmp_path):
    env = {"CUDA_MPS_PIPE_DIRECTORY": "/tmp/gpuops-gpucheck-x/mps/pipe"}
    fake(tmp_path, 500, 1, ["/usr/bin/nvidia-cuda-mps-control", "-f"])
    fake(tmp_path, 600, 1, ["nvidia-cuda-mps-server"], b"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps\0")  # the system's
    assert scenarios.mps_server(500, env, str(tmp_path)) is None
    fake(tmp_path, 700, 1, ["nvidia-cuda-mps-server"], b"CUDA_MPS_PIPE_DIRECTORY=/tmp/gpuops-gpucheck-x/mps/pipe\0")
    assert scenarios.mps_server(500, env, str(tmp_path)) == 700
    fake(tmp_path, 501, 500, ["/usr/bin/nvidia-cuda-mps-server"])
    assert scenarios.mps_server(500, env, str(tmp_path)) == 501
