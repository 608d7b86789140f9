# The two commands of the README:
#   make demo   set up this checkout, then reset an orphaned vLLM TP=8 tree on a simulated 8-GPU node
#   make test   set up this checkout, then run every test (pytest, ansible-test sanity, ansible-lint)
.PHONY: setup demo test clean

setup:
	@./scripts/setup.sh

demo: setup
	@./scripts/demo.sh

test: setup
	@./scripts/test.sh

clean:
	tests/sim/gpunode down --all
	rm -rf tests/sim/build .collections
