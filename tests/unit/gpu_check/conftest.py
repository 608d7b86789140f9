"""Make tests/gpu's check package (gpucheck) and check.py importable for these tests."""

import os
import sys

GPU_CHECK_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "gpu")
if GPU_CHECK_DIR not in sys.path:
    sys.path.insert(0, GPU_CHECK_DIR)
