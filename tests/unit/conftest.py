"""Make the collection importable as ansible_collections.gpuops.nvidia for unit tests."""

import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COLLECTIONS = os.path.join(REPO, ".collections")
if not os.path.isdir(os.path.join(COLLECTIONS, "ansible_collections", "gpuops", "nvidia")):
    os.makedirs(os.path.join(COLLECTIONS, "ansible_collections", "gpuops"), exist_ok=True)
    os.symlink("../../..", os.path.join(COLLECTIONS, "ansible_collections", "gpuops", "nvidia"))
if COLLECTIONS not in sys.path:
    sys.path.insert(0, COLLECTIONS)
