"""Shrunk world found by `make worlds` (tests/worlds/run.py), fixed since (_holders: a zombie creator is an exited
creator, and a worker holding a listed exited creator's context is no evidence that a live holder shares a number).
It was: gpu_kill failed: signalled 0 process(es), 0 exited; left alone: PID 676 (python3 train.p): user root not in
users; PID 679 (pt_data_worker): command line does not match 'train'; PID 680 (python3 train.p): user root not in
users; not released after 3.0 s: GPU 0: 1536 MiB used, 512 MiB of it by holder
"""

from worlds.world import replay

WORLD = {
    'setup': {'gpus': 1, 'mig': False, 'gb10': False, 'old_driver': False},
    'procs': [
        {
            'id': 'p0',
            'kind': 'holder',
            'gpus': [0],
            'gi': {},
            'mib': 512,
            'title': 'python3 train.py',
            'ignore_term': False,
            'user': 'root',
        },
        {
            'id': 'p1',
            'kind': 'trainer',
            'gpus': [0],
            'gi': {},
            'mib': 512,
            'title': 'python3 train.py',
            'workers': 1,
            'creator_end': 'zombie',
            'reuse': None,
        },
        {
            'id': 'p2',
            'kind': 'holder',
            'gpus': [0],
            'gi': {},
            'mib': 512,
            'title': 'python3 train.py',
            'ignore_term': False,
            'user': 'root',
        },
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
            'users': ['nobody'],
        },
    },
}


def test_world():
    assert replay(WORLD) == []
