"""Shrunk world found by `make worlds` (tests/worlds/run.py):
MIG instance: a dead creator's number reused by a holder with its own context on the same instance: gpu_facts names
the reuser only, not the worker that keeps the dead creator's context
"""

import pytest

from worlds.world import replay

WORLD = {
    'setup': {'gpus': 2, 'mig': True, 'gb10': False, 'old_driver': False},
    'procs': [
        {
            'id': 'p0',
            'kind': 'trainer',
            'gpus': [1],
            'gi': {'1': 3},
            'mib': 512,
            'title': 'python3 train.py',
            'workers': 1,
            'creator_end': 'reaped',
            'reuse': 'holder',
            'reuse_gpus': [1],
        }
    ],
    'selection': {
        'gpus': None,
        'pids': None,
        'options': {
            'grace_period': 1.0,
            'kill_wait': 3.0,
            'wait': True,
            'wait_timeout': 3.0,
            'driver_timeout': 10.0,
            'match': 'train',
            'users': ['root'],
        },
    },
}

VIOLATION = (
    "MIG instance: a dead creator's number reused by a holder with its own context on the same instance: "
    "gpu_facts names the reuser only, not the worker that keeps the dead creator's context"
)


@pytest.mark.xfail(strict=True, reason=VIOLATION)
def test_world():
    assert replay(WORLD) == []
