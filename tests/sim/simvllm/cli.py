"""Command line of the simulated vLLM: `vllm serve MODEL [flags]` and `vllm --version`.

Flags that matter to the simulation are parsed; any other flag is accepted and ignored (with a
warning), so deployments written for real vLLM start unchanged. As in vLLM, `--flag_name` is the
same as `--flag-name`.
"""

import argparse
import json
import os
import sys

from simvllm import facts


def _json_object(text):
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


_json_object.__name__ = "JSON"  # argparse's message: "invalid JSON value: ..."


def _normalize(argv):
    """Spell `--flag_name[=value]` as `--flag-name[=value]`, as vLLM's FlexibleArgumentParser does."""
    normalized = []
    for arg in argv:
        if arg.startswith("--"):
            key, sep, value = arg.partition("=")
            arg = key.replace("_", "-") + sep + value
        normalized.append(arg)
    return normalized


def build_parser():
    """The argparse parser of the `vllm` command."""
    parser = argparse.ArgumentParser(prog="vllm", allow_abbrev=False)
    parser.add_argument("-v", "--version", action="version", version=facts.version(os.environ))
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", allow_abbrev=False, help="Start the OpenAI-compatible API server.")
    serve.add_argument("model_tag", nargs="?", help="model path or name")
    serve.add_argument("--model", help="model path or name (instead of the positional argument)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    serve.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    # vllm/config/cache.py CacheConfig.gpu_memory_utilization: facts.facts_of(environ).gpu_memory_utilization (0.9 for LEGACY)
    serve.add_argument("--gpu-memory-utilization", type=float, default=None)
    serve.add_argument("--max-num-batched-tokens", type=int, default=None)
    serve.add_argument("--max-model-len", type=int, default=4096)
    serve.add_argument("--served-model-name", nargs="+")
    serve.add_argument("--speculative-config", type=_json_object)
    serve.add_argument("--api-key")
    serve.add_argument("--shutdown-timeout", type=int, default=facts.SHUTDOWN_TIMEOUT_DEFAULT)
    serve.add_argument("--enforce-eager", action="store_true")
    serve.add_argument("--max-num-seqs", type=int, default=1024)
    serve.add_argument("--disable-log-stats", action="store_true")
    # Launch modes (vllm/entrypoints/cli/serve.py): several API servers, data parallelism, the executor.
    serve.add_argument("--api-server-count", "-asc", type=int, default=None)
    serve.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    serve.add_argument("--enable-expert-parallel", action="store_true")
    serve.add_argument("--distributed-executor-backend", choices=("mp", "ray"), default=None)
    return parser


def main(argv=None):
    """Run the `vllm` command with `argv` (default sys.argv[1:]). Returns the exit status."""
    parser = build_parser()
    args, args.ignored_arguments = parser.parse_known_args(_normalize(sys.argv[1:] if argv is None else argv))
    args.model = args.model_tag or args.model
    if not args.model:
        parser.error("serve: a model is required (vllm serve MODEL)")
    if args.gpu_memory_utilization is None:
        # None (0.34): the extensible KV cache, sized from the memory free at start (simvllm.engine)
        default = facts.facts_of(os.environ).gpu_memory_utilization
        args.gpu_memory_utilization = 0.9 if facts.is_legacy(os.environ) else default
    elif not 0 < args.gpu_memory_utilization <= 1:
        parser.error("--gpu-memory-utilization must be in (0, 1], got %s" % args.gpu_memory_utilization)
    if args.tensor_parallel_size < 1 or args.pipeline_parallel_size < 1:
        parser.error("--tensor-parallel-size and --pipeline-parallel-size must be at least 1")
    from simvllm.api_server import run_api_server

    return run_api_server(args)
