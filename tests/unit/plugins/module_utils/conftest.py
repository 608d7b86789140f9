"""Fixtures of the module_utils tests that start real processes."""

from __future__ import annotations

import subprocess

import pytest

from polling import wait_exec


@pytest.fixture
def spawn():
    """spawn(argv, wait=False, **Popen kwargs) -> Popen; with `wait`, once the child runs argv[0]. Every child still
    running at teardown is killed and reaped."""
    started = []

    def start(argv, wait=False, **kwargs):
        child = subprocess.Popen(argv, **kwargs)
        started.append(child)
        if wait:
            wait_exec(child.pid, argv[0])
        return child

    yield start
    for child in started:
        if child.poll() is None:
            child.kill()
        child.wait()
        if child.stdout:
            child.stdout.close()
