"""The GPU acceptance check's parts (tests/gpu/check.py): driver readings, workloads, Ansible runs, timing, report."""
