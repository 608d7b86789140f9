# The two commands of the README:
#   make demo   set up this checkout, then reset an orphaned vLLM TP=8 tree on a simulated 8-GPU node
#   make test   set up this checkout, then run every test (pytest, ansible-test sanity, ansible-lint)
.PHONY: setup demo test clean check-vllm-source worlds

setup:
	@./scripts/setup.sh

demo: setup
	@./scripts/demo.sh

test: setup
	@./scripts/test.sh

# Simulated nodes are shared by every checkout on this machine (/tmp/gpuops-sim): list them with
# `tests/sim/gpunode list` and end yours with `tests/sim/gpunode down NAME`.
clean:
	rm -rf tests/sim/build .collections

# Not part of `make test`: downloads each supported vllm wheel once (pip download, cached in
# ~/.cache/gpuops-nvidia/wheels) and checks the collection's and the simulator's vLLM tables of each release against
# its source (docs/vllm_server.md). VLLM_VERSION=0.34.0 checks one release.
VLLM_VERSION ?=
check-vllm-source:
	@[ -x .venv/bin/python ] || ./scripts/setup.sh
	@.venv/bin/python scripts/check_vllm_source.py $(if $(VLLM_VERSION),--version $(VLLM_VERSION))

# Not part of `make test` (its fixed-seed run is): N generated worlds judged by an oracle (CONTRIBUTING.md,
# "Generated worlds"); prints worlds run, decisions checked and violations. SEED=1 replays a run.
N ?= 100
SEED ?=
worlds:
	@[ -x .venv/bin/python ] || ./scripts/setup.sh
	@.venv/bin/python tests/worlds/run.py --worlds $(N) $(if $(SEED),--seed $(SEED))
