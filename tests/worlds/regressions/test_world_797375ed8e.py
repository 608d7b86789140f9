"""Shrunk world found by `make worlds` (tests/worlds/run.py), fixed since in the worlds (the planter noted a zombie
creator before it was one: the oracle read it as a holder while it still closed its files). It was: gpu_facts GPU 0:
holder_pids [7840, 7841], the oracle's holders [7839, 7840, 7841]
"""

from worlds.world import replay

WORLD = {
    'setup': {'gpus': 1, 'mig': False, 'gb10': False, 'old_driver': True},
    'procs': [
        {'id': 'p0', 'kind': 'sleeper'},
        {'id': 'p1', 'kind': 'sleeper'},
        {
            'id': 'p2',
            'kind': 'trainer',
            'gpus': [0],
            'gi': {},
            'mib': 512,
            'title': 'python3 serve.py',
            'workers': 2,
            'creator_end': 'zombie',
            'reuse': None,
        },
    ],
    'selection': {
        'gpus': None,
        'pids': None,
        'options': {
            'grace_period': 0.5,
            'kill_wait': 3.0,
            'wait': True,
            'wait_timeout': 3.0,
            'driver_timeout': 10.0,
            'match': 'train',
            'users': ['root'],
        },
    },
    'through': 'modules',
}


def test_world():
    assert replay(WORLD) == []
