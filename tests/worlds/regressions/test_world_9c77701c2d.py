"""Shrunk world found by `make worlds` (tests/worlds/run.py), fixed since (_holders._shared_numbers: where several
listed numbers could be shared with a dead creator, the one whose context the creator's worker holds on another GPU
is). It was: gpu_kill failed: signalled 1 process(es), 1 exited; left alone: PID 1348 (python3 serve.p): command line
does not match 'train'; PID 1349 (pt_data_worker): command line does not match 'train'; PID 1354 (nvidia-persiste):
command line does not match 'train'; not released after 3.1 s: GPU 0: 1536 MiB
"""

from worlds.world import replay

WORLD = {
    'setup': {'gpus': 2, 'mig': True, 'gb10': False, 'old_driver': False},
    'procs': [
        {
            'id': 'p0',
            'kind': 'trainer',
            'gpus': [0, 1],
            'gi': {'1': 3},
            'mib': 512,
            'title': 'python3 train.py',
            'workers': 1,
            'creator_end': 'reaped',
            'reuse': 'holder',
            'reuse_gpus': [0],
        },
        {'id': 'p1', 'kind': 'nvml'},
        {'id': 'p2', 'kind': 'nvml'},
        {'id': 'p3', 'kind': 'cuinit'},
        {
            'id': 'p4',
            'kind': 'holder',
            'gpus': [0],
            'gi': {},
            'mib': 512,
            'title': 'python3 train.py',
            'ignore_term': False,
            'user': 'root',
            'lifetime': None,
        },
        {'id': 'p5', 'kind': 'daemon', 'gpus': [0], 'gi': {}, 'mib': 512, 'name': 'nvidia-persistenced', 'real': False},
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
