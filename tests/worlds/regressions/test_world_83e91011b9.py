"""Shrunk world found by `make worlds` (tests/worlds/run.py), fixed since (_kill: where the selection leaves a holder
alone, the run's first look scans every process: the reuser of a dead creator's number, left alone, never exits to
reveal the worker that keeps that creator's context). It was: selected holder PID 1917 still alive and not reported
"""

from worlds.world import replay

WORLD = {
    'setup': {'gpus': 1, 'mig': False, 'gb10': True, 'old_driver': False},
    'procs': [
        {
            'id': 'p0',
            'kind': 'trainer',
            'gpus': [0],
            'gi': {},
            'mib': 512,
            'title': 'python3 train.py',
            'workers': 1,
            'creator_end': 'reaped',
            'reuse': 'holder',
            'reuse_gpus': [0],
        }
    ],
    'selection': {
        'gpus': [('index', 0)],
        'pids': None,
        'options': {
            'grace_period': 0.5,
            'kill_wait': 3.0,
            'wait': True,
            'wait_timeout': 3.0,
            'driver_timeout': 10.0,
            'match': 'pt_data_worker',
            'exclude': ['nvidia-persistenced', 'dcgm-exporter'],
        },
    },
    'through': 'modules',
}


def test_world():
    assert replay(WORLD) == []
