"""HTTP surface of the simulated vLLM API server (stdlib http.server, one thread per connection).

GET /health (200; 503 once EngineCore is dead), GET /version, GET /metrics (Prometheus text),
GET /v1/models, POST /v1/completions, POST /v1/chat/completions. With an API key, /v1/* need
`Authorization: Bearer KEY` (401 otherwise); /health, /version and /metrics never do.
Generation is deterministic: token i of a reply is a word drawn from a generator seeded by the
prompt; a prompt's token count is its number of whitespace-separated words.

Timing and shutdown (vLLM 0.33, see tests/sim/simvllm/README.md for the sources):
- a request takes `token_seconds` per generated token (SIMVLLM_TOKEN_SECONDS, default 0);
- at most `max_num_seqs` requests run at once (--max-num-seqs); the others wait, counted in
  vllm:num_requests_waiting;
- once shutdown starts (`begin_shutdown`), new requests finish at once with finish_reason
  "abort" (EngineCore `_reject_add_in_shutdown`); `abort_all` ends the running ones the same way
  (shutdown timeout 0, or its deadline passed);
- with `log_stats` false (--disable-log-stats) /metrics carries no vllm:* metric at all;
- `collapse_after_s` (SIMVLLM_ACCEPTANCE_COLLAPSE_AFTER): that many seconds after the server
  starts listening, every request's acceptance drops to 1 % (acceptance decaying while serving,
  vllm-project/vllm#11188).
"""

import hashlib
import json
import os
import random
import socket
import socketserver
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from simvllm import facts
from simvllm.specdecode import draft_counts

VOCABULARY = (
    "the",
    "GPU",
    "holds",
    "a",
    "context",
    "while",
    "vLLM",
    "serves",
    "tokens",
    "and",
    "memory",
    "is",
    "freed",
    "when",
    "every",
    "handle",
    "closes",
    "so",
    "operators",
    "poll",
)
DEFAULT_MAX_TOKENS = 16
COLLAPSED_ACCEPTANCE = 0.01


@dataclass
class ServingState:
    """What the HTTP handlers share. Counters are guarded by `lock`."""

    served_model_names: list
    max_model_len: int
    api_key: str = None
    speculative: object = None  # SpeculativeDecoding or None
    engine_dead: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)
    num_requests_running: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    accepted_per_position: list = None
    token_seconds: float = 0.0
    max_num_seqs: int = 1024
    log_stats: bool = True
    collapse_after_s: float = None
    stall_after_s: float = None
    num_requests_waiting: int = 0
    serving_since: float = None
    shutting_down: bool = False
    aborted: threading.Event = field(default_factory=threading.Event)
    slots: threading.Semaphore = None

    def __post_init__(self):
        if self.speculative is not None:
            self.accepted_per_position = [0] * self.speculative.num_speculative_tokens
        self.slots = threading.Semaphore(self.max_num_seqs)

    def start_serving(self):
        self.serving_since = time.monotonic()

    def collapsed(self):
        """True once acceptance has collapsed (collapse_after_s seconds after the port started listening)."""
        return (
            self.collapse_after_s is not None
            and self.serving_since is not None
            and time.monotonic() - self.serving_since >= self.collapse_after_s
        )

    def stalled(self):
        """True once the engine is stuck (stall_after_s seconds after the port started listening): /health still
        answers 200, running requests stay running, and no token comes out (SIMVLLM_STALL_AFTER)."""
        return (
            self.stall_after_s is not None
            and self.serving_since is not None
            and time.monotonic() - self.serving_since >= self.stall_after_s
        )

    def begin_shutdown(self):
        """From now on new requests are aborted at once (vLLM 0.33 EngineCore in shutdown)."""
        with self.lock:
            self.shutting_down = True

    def abort_all(self):
        """Abort the running and waiting requests (finish_reason "abort")."""
        self.begin_shutdown()
        self.aborted.set()

    def busy(self):
        with self.lock:
            return self.num_requests_running + self.num_requests_waiting

    def generate(self, num_tokens):
        """Run one request of `num_tokens` tokens: wait for a slot, take token_seconds per token.

        Returns (tokens generated, finish_reason): "length", or "abort" when shutdown aborted it.
        """
        with self.lock:
            if self.shutting_down:
                return 0, "abort"
            self.num_requests_waiting += 1
        while not self.slots.acquire(timeout=0.05):
            if self.aborted.is_set():
                with self.lock:
                    self.num_requests_waiting -= 1
                return 0, "abort"
        with self.lock:
            self.num_requests_waiting -= 1
            self.num_requests_running += 1
        try:
            generated = 0
            step = max(1, int(0.05 / self.token_seconds)) if self.token_seconds > 0 else num_tokens
            while generated < num_tokens:
                if self.stalled():
                    if self.aborted.wait(0.05):
                        return generated, "abort"
                    continue
                chunk = min(step, num_tokens - generated)
                if self.aborted.wait(self.token_seconds * chunk) if self.token_seconds > 0 else self.aborted.is_set():
                    return generated, "abort"
                generated += chunk
                # Counted as they come, as vLLM's stat logger records every engine step's tokens.
                with self.lock:
                    self.generation_tokens += chunk
            return generated, "length"
        finally:
            with self.lock:
                self.num_requests_running -= 1
            self.slots.release()

    def record(self, prompt, prompt_tokens, generated_tokens):
        """Count one finished request (and its drafts, with speculative decoding)."""
        drafts = None
        if self.speculative and generated_tokens:
            rate = COLLAPSED_ACCEPTANCE if self.collapsed() else self.speculative.acceptance_rate(prompt)
            drafts = draft_counts(self.speculative.num_speculative_tokens, rate, generated_tokens)
        with self.lock:
            self.prompt_tokens += prompt_tokens
            if drafts:
                self.num_drafts += drafts[0]
                self.num_draft_tokens += drafts[0] * self.speculative.num_speculative_tokens
                for position, accepted in enumerate(drafts[1]):
                    self.accepted_per_position[position] += accepted

    def render_metrics(self):
        """The /metrics page (Prometheus text exposition format)."""
        labels = 'engine="0",model_name="%s"' % self.served_model_names[0]
        lines = []

        def metric(name, kind, help_text, samples):
            lines.append("# HELP %s %s" % (name, help_text))
            lines.append("# TYPE %s %s" % (name, kind))
            suffix = "_total" if kind == "counter" else ""
            for extra_labels, value in samples:
                lines.append("%s%s{%s%s} %.1f" % (name, suffix, labels, extra_labels, value))

        if not self.log_stats:
            # --disable-log-stats: vLLM creates no stat logger, so no vllm:* metric (only the Python client's own).
            return "# HELP python_info Python platform information\n# TYPE python_info gauge\n"
        with self.lock:
            metric(
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                [("", self.num_requests_running)],
            )
            metric(
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                [("", self.num_requests_waiting)],
            )
            metric("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.", [("", self.prompt_tokens)])
            metric(
                "vllm:generation_tokens",
                "counter",
                "Number of generation tokens processed.",
                [("", self.generation_tokens)],
            )
            if self.speculative is not None:
                metric(
                    "vllm:spec_decode_num_drafts", "counter", "Number of spec decoding drafts.", [("", self.num_drafts)]
                )
                metric(
                    "vllm:spec_decode_num_draft_tokens",
                    "counter",
                    "Number of draft tokens.",
                    [("", self.num_draft_tokens)],
                )
                metric(
                    "vllm:spec_decode_num_accepted_tokens",
                    "counter",
                    "Number of accepted tokens.",
                    [("", sum(self.accepted_per_position))],
                )
                metric(
                    "vllm:spec_decode_num_accepted_tokens_per_pos",
                    "counter",
                    "Accepted tokens per draft position.",
                    [
                        (',position="%d"' % position, accepted)
                        for position, accepted in enumerate(self.accepted_per_position)
                    ],
                )
        return "\n".join(lines) + "\n"


class RequestError(Exception):
    """An OpenAI-style error reply: `status` and message."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


def generate_text(prompt, num_tokens):
    """`num_tokens` deterministic words for `prompt`, as one string with a leading space."""
    seed = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big")
    words = random.Random(seed).choices(VOCABULARY, k=num_tokens)
    return "".join(" " + word for word in words)


def count_tokens(text):
    return max(1, len(text.split()))


class Handler(BaseHTTPRequestHandler):
    """Routes requests to the OpenAI-compatible endpoints; `server.state` is the ServingState."""

    server_version = "uvicorn"
    sys_version = ""

    def log_request(self, code="-", size="-"):
        """Access log line in uvicorn's format."""
        phrase = code.phrase if isinstance(code, HTTPStatus) else HTTPStatus(int(code)).phrase
        sys.stdout.write(
            'INFO:     %s:%d - "%s" %d %s\n'
            % (self.client_address[0], self.client_address[1], self.requestline, int(code), phrase)
        )
        sys.stdout.flush()

    def log_message(self, format, *args):  # noqa: A002 (signature of BaseHTTPRequestHandler)
        sys.stderr.write("WARNING:  %s\n" % (format % args))

    def _reply(self, status, body, content_type="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status, message):
        error_type = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
        self._reply(status, {"error": {"message": message, "type": error_type, "param": None, "code": status}})

    def _authorized(self):
        api_key = self.server.state.api_key
        if not api_key or not self.path.startswith("/v1"):
            return True
        if self.headers.get("Authorization") == "Bearer " + api_key:
            return True
        self._reply(401, {"error": "Unauthorized"})
        return False

    def do_GET(self):  # noqa: N802 (http.server naming)
        state = self.server.state
        path = self.path.split("?", 1)[0]
        if not self._authorized():
            return
        if path == "/health":
            self._reply(503 if state.engine_dead else 200, "", "text/plain")
        elif path == "/version":
            self._reply(200, {"version": facts.version(os.environ)})
        elif path == "/metrics":
            self._reply(200, state.render_metrics(), "text/plain; version=0.0.4; charset=utf-8")
        elif path == "/v1/models":
            created = int(time.time())
            self._reply(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": name,
                            "object": "model",
                            "created": created,
                            "owned_by": "vllm",
                            "root": state.served_model_names[0],
                            "parent": None,
                            "max_model_len": state.max_model_len,
                        }
                        for name in state.served_model_names
                    ],
                },
            )
        else:
            self._reply(404, {"detail": "Not Found"})

    def do_POST(self):  # noqa: N802 (http.server naming)
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._reply(404, {"detail": "Not Found"})
            return
        if not self._authorized():
            return
        try:
            request = self._read_json()
            if path == "/v1/completions":
                self._reply(200, self._complete(request))
            else:
                self._reply(200, self._chat(request))
        except RequestError as error:
            self._error(error.status, str(error))

    def _read_json(self):
        length = int(self.headers.get("Content-Length") or 0)
        try:
            request = json.loads(self.rfile.read(length) or b"null")
        except ValueError as error:
            raise RequestError(400, "Invalid JSON body: %s" % error) from None
        if not isinstance(request, dict):
            raise RequestError(400, "The request body must be a JSON object.")
        return request

    def _check_request(self, request, prompt_tokens):
        """Validate model and max_tokens; returns (model name, number of tokens to generate)."""
        state = self.server.state
        if state.engine_dead:
            raise RequestError(500, "EngineCore encountered an issue. See stack trace (above) for the root cause.")
        model = request.get("model") or state.served_model_names[0]
        if model not in state.served_model_names:
            raise RequestError(404, "The model `%s` does not exist." % model)
        max_tokens = request.get("max_completion_tokens", request.get("max_tokens", DEFAULT_MAX_TOKENS))
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise RequestError(400, "max_tokens must be at least 1, got %r." % (max_tokens,))
        if prompt_tokens + max_tokens > state.max_model_len:
            raise RequestError(
                400,
                (
                    "This model's maximum context length is %d tokens. However, you requested %d tokens "
                    "(%d in the messages, %d in the completion). Please reduce the length of the "
                    "messages or completion."
                    % (state.max_model_len, prompt_tokens + max_tokens, prompt_tokens, max_tokens)
                ),
            )
        return model, max_tokens

    def _complete(self, request):
        prompt = request.get("prompt")
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not prompts or not isinstance(prompts, list) or not all(isinstance(p, str) for p in prompts):
            raise RequestError(400, "prompt must be a string or a list of strings.")
        prompt_tokens = [count_tokens(p) for p in prompts]
        model, max_tokens = self._check_request(request, max(prompt_tokens))
        choices = []
        completion_tokens = 0
        for index, (text, tokens) in enumerate(zip(prompts, prompt_tokens)):
            generated, finish_reason = self.server.state.generate(max_tokens)
            self.server.state.record(text, tokens, generated)
            completion_tokens += generated
            choices.append(
                {
                    "index": index,
                    "text": generate_text(text, generated),
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                }
            )
        return {
            "id": "cmpl-%s" % uuid.uuid4().hex,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": {
                "prompt_tokens": sum(prompt_tokens),
                "completion_tokens": completion_tokens,
                "total_tokens": sum(prompt_tokens) + completion_tokens,
            },
        }

    def _chat(self, request):
        messages = request.get("messages")
        if (
            not messages
            or not isinstance(messages, list)
            or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages)
        ):
            raise RequestError(400, "messages must be a list of {role, content} objects.")
        prompt = "\n".join(m["content"] for m in messages)
        prompt_tokens = count_tokens(prompt)
        model, max_tokens = self._check_request(request, prompt_tokens)
        generated, finish_reason = self.server.state.generate(max_tokens)
        self.server.state.record(prompt, prompt_tokens, generated)
        return {
            "id": "chatcmpl-%s" % uuid.uuid4().hex,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": generate_text(prompt, generated).lstrip()},
                    "logprobs": None,
                    "finish_reason": finish_reason,
                    "stop_reason": None,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": generated,
                "total_tokens": prompt_tokens + generated,
            },
        }


class ApiHttpServer(ThreadingHTTPServer):
    """ThreadingHTTPServer bound at construction, listening only after `start_listening()`."""

    daemon_threads = True

    def __init__(self, host, port, state):
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__((host, port), Handler, bind_and_activate=False)
        self.state = state
        try:
            socketserver.TCPServer.server_bind(self)  # HTTPServer's would resolve the host name
        except OSError:
            self.server_close()
            raise
        self.server_name, self.server_port = host, self.server_address[1]

    def start_listening(self):
        """listen() and serve in a daemon thread."""
        self.server_activate()
        self.state.start_serving()
        threading.Thread(target=self.serve_forever, name="http", daemon=True).start()
