"""Shrunk world found by `make worlds` (tests/worlds/run.py), fixed since (_holders.numbers_foreign: a driver before
535.113.01 seen from a nested PID namespace lists another namespace's numbers, so every process here that shows a
context on a GPU holds it, and the look scans every process). It was: gpu_facts GPU 0: holder_pids [], the oracle's
holders [270]; gpu_kill failed: signalled 0 process(es), 0 exited; the driver lists PID 269 (512 MiB) on GPU 0,
which no process here holds (a container?): not signalled; not released after 3.0 s: GPU 0: 512 MiB used, no
selected holder; next: the driver
"""

from worlds.world import replay

WORLD = {
    'setup': {'gpus': 1, 'mig': False, 'gb10': False, 'old_driver': True},
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
            'reuse': None,
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
