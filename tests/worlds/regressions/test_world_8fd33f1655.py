"""Shrunk world found by `make worlds` (tests/worlds/run.py), fixed since (_holders._shared_numbers: on a MIG instance
too, a number listed twice on one instance is shared by a dead creator's context, held by the process the lists
leave out that has that instance's capability files; and the worlds' MIG contexts now hold their capability files,
as real ones do). It was: MIG instance: a dead creator's number reused by a holder with its own context on the same
instance: gpu_facts names the reuser only, not the worker that keeps the dead creator's context
"""

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


def test_world():
    assert replay(WORLD) == []
