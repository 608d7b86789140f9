"""Simulated vLLM (`vllm serve`) for the simulated GPU nodes (test infrastructure).

It reproduces what an operator of vLLM's V1 engine sees from outside: the process tree
(API server -> `VLLM::EngineCore` -> `VLLM::Worker_TP<n>`), the CUDA contexts each GPU rank
creates per the simulator contract (tests/sim/README.md), the signal behaviour (clean SIGTERM
shutdown, orphans after SIGKILL, the warm-up orphan bug), and an OpenAI-compatible HTTP surface
with Prometheus metrics including speculative-decoding acceptance counters.

Entry point: `simvllm.cli.main()` (the node's `vllm` script). The vLLM release modelled is SIMVLLM_VERSION
(default 0.33.0; `simvllm.facts.version`), and `simvllm.install` writes an installation of one release.
"""
