"""Fixtures shared by every test directory: simulated GPU nodes (see tests/simnode.py)."""

from __future__ import annotations

import functools
import itertools
import os
import subprocess

import pytest

from simnode import Node, up

_node_numbers = itertools.count()

# Files whose every test runs the vllm_server role or a vLLM server on a node (one redeploy: 20 s or more): their
# tests are slow without a mark of their own.
SLOW_FILES = "tests/integration/test_vllm_"


# The unit tests: a few milliseconds each.
FAST_DIR = "tests/unit/"


def pytest_collection_modifyitems(items):
    """Slow tests first (pytest.ini's `slow` marker; every test of SLOW_FILES), the unit tests last, the order
    otherwise kept.

    Under pytest-xdist (scripts/test.sh) the workers then take the long tests first and the unit tests fill in at
    the end, so they finish together rather than one running a 10 s integration test while the others wait."""
    for item in items:
        if item.nodeid.startswith(SLOW_FILES):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: (item.get_closest_marker("slow") is None, item.nodeid.startswith(FAST_DIR)))


@functools.lru_cache(maxsize=None)
def _namespaces_refused() -> str | None:
    """Why this process cannot create a node's namespaces, or None if it can."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    try:
        result = subprocess.run(
            ["unshare", *user, "--pid", "--mount", "--fork", "true"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except OSError as error:
        return f"cannot run unshare: {error}"
    if result.returncode != 0:
        return f"unshare --pid --mount is not permitted here: {result.stderr.strip()}"
    return None


@pytest.fixture(scope="session")
def node_namespaces():
    """Skips the test where this process cannot create a node's namespaces (for fixtures that make nodes)."""
    refused = _namespaces_refused()
    if refused:
        pytest.skip(refused)


@pytest.fixture
def simnode():
    """Factory `simnode(**knobs) -> Node` (knobs as simnode.up); every node it made is downed
    after the test, even when the test fails. Skips the test where namespaces are refused."""
    refused = _namespaces_refused()
    if refused:
        pytest.skip(refused)
    nodes: list[Node] = []

    def make(**knobs) -> Node:
        node = up(f"t-{os.getpid()}-{next(_node_numbers)}", **knobs)
        nodes.append(node)
        return node

    yield make
    failures = []
    for node in nodes:
        try:
            node.down()
        except Exception as error:  # down every node before reporting
            failures.append(f"{node.name}: {error}")
    if failures:
        pytest.fail("could not down simulated nodes:\n" + "\n".join(failures))
