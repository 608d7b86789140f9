#!/usr/bin/env bash
# The main job on a simulated GPU node: an orphaned vLLM TP=8 tree holds all 8 GPUs;
# playbooks/reset_gpus.yml finds it, ends it and waits until the memory is released.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
export PATH="$PWD/.venv/bin:$PATH"
node="demo-$$"
inv=$(mktemp /tmp/gpuops-demo-XXXXXX.ini)
trap 'tests/sim/gpunode down "$node" >/dev/null 2>&1; rm -f "$inv"' EXIT
in_node() { tests/sim/gpunode exec "$node" -- "$@"; }
show() { ansible -o -i "$inv" all -m gpuops.nvidia.gpu_facts 2>/dev/null | python3 scripts/show_gpus.py; }

echo "== 1. A simulated GPU server: 8 x H100 80GB, driver release latency 1 s"
tests/sim/gpunode up "$node" --gpus 8 --release-latency 1 >/dev/null
tests/sim/gpunode inventory "$node" > "$inv"

echo "== 2. vllm serve /models/llama-70b --tensor-parallel-size 8, then kill -9 of its API server"
in_node sh -c 'setsid -f vllm serve /models/llama-70b --tensor-parallel-size 8 --gpu-memory-utilization 0.9 >/dev/null 2>&1'
for _ in $(seq 100); do
  n=$(in_node sh -c 'ls /run/gpusim/contexts | wc -l'); [ "$n" -ge 8 ] && break; sleep 0.1
done
# shellcheck disable=SC2016  # the loop is expanded by the shell inside the node
api=$(in_node sh -c 'for p in /proc/[0-9]*; do if tr "\0" " " < $p/cmdline 2>/dev/null | grep -q "bin/vll[m] serve"; then echo ${p#/proc/}; break; fi; done')
in_node kill -9 "$api"
echo "   API server PID $api killed; EngineCore and its workers are orphaned (parent: the node's init, PID 1):"
sleep 0.5
in_node ps -o pid,ppid,stat,comm,args -C gpusim-init,ps --deselect
echo "   What holds the GPUs (gpuops.nvidia.gpu_facts):"
show

echo
echo "== 3. ansible-playbook playbooks/reset_gpus.yml"
ansible-playbook -i "$inv" playbooks/reset_gpus.yml

echo "== 4. After the reset (EngineCore exits by itself once its workers are gone, as vLLM's worker monitor does)"
show
left=$(in_node ps -o pid,ppid,stat,comm,args -C gpusim-init,ps --deselect --no-headers || true)
echo "${left:-   no process left in the node but its init}"
echo
echo "== 5. A second run changes nothing:"
ansible-playbook -i "$inv" playbooks/reset_gpus.yml | grep -A1 "PLAY RECAP"
