#!/usr/bin/env bash
# The guard's Prometheus files, checked by promtool (Debian package prometheus, installed by scripts/setup.sh):
# the rules (check rules, and their unit tests), and a textfile that gpu_guard's code renders from a sample look
# (check metrics: names, units, HELP and TYPE); amtool checks the Alertmanager route of the remediation. The textfile of a real look is checked by
# tests/integration/test_guard_metrics.py. Run from anywhere; exit 1 on the first failure.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/../.."
promtool=${PROMTOOL:-promtool}
command -v "$promtool" >/dev/null || { echo "promtool is missing: run scripts/setup.sh" >&2; exit 1; }
"$promtool" check rules extensions/prometheus/gpuops_nvidia_guard.rules.yml
"$promtool" test rules tests/prometheus/gpuops_nvidia_guard.test.yml
# The Alertmanager route and receiver of the remediation (Debian package prometheus-alertmanager).
amtool=${AMTOOL:-amtool}
command -v "$amtool" >/dev/null || { echo "amtool is missing: run scripts/setup.sh" >&2; exit 1; }
"$amtool" check-config extensions/alertmanager/gpuops_nvidia_guard.yml >/dev/null
PYTHONPATH=.collections .venv/bin/python - <<'PY' | "$promtool" check metrics
from ansible_collections.gpuops.nvidia.plugins.module_utils.gpu import _guard_metrics

gpu = {"index": 0, "uuid": "GPU-1", "memory_used_mib": 75034, "memory_reserved_mib": 529, "unexplained_mib": 0,
       "tolerance_mib": 256, "holder_pids": [11], "exited": [],
       "recovery": {"action": "gpu_reset", "xids": [{"xid": 79}, {"xid": 13}, {"xid": 13}]}}
orphan = {"pid": 11, "start_ticks": 307177, "comm": 'VLLM::Worker_TP "x"\\', "reason": "vllm_server_exited",
          "owner_label": "unit:vllm@a.service", "gpus": [0], "memory_mib": {"0": 75034}}
vllm = [{"name": "qwen", "url": "http://127.0.0.1:8000", "state": "stalled", "requests_running": 3}]
found = _guard_metrics.samples({"gpus": [gpu], "driver": {}}, [orphan], vllm, True, 1796407843.5, "gpu07")
print(_guard_metrics.render(found), end="")
PY
echo "promtool and amtool: rules, their tests, the route and the textfile's metrics are fine"
