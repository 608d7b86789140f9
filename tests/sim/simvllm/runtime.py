"""Process plumbing shared by the API server, EngineCore and the workers.

- `setup_logging`: vLLM-style log lines, `(EngineCore pid=12) INFO 11-29 07:56:12 [file.py:42] ...`,
  INFO/WARNING on stdout, ERROR on stderr.
- `SignalWaker`: turns SIGTERM/SIGINT into events on a socket (signal.set_wakeup_fd), so each
  process waits for signals and pipe messages in one `select`.
- `LineChannel`: JSON messages, one per line, over one end of a socketpair between a parent and
  a child process; EOF means the other process exited (a "death pipe").
- `spawn_child`: starts a child process of this package that keeps the channel's other end (and, as
  multiprocessing's children do, the pipes of its sentinel).
"""

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time
from collections import deque

PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_CHILD_BOOTSTRAP = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from simvllm.engine import child_main; sys.exit(child_main(sys.argv[2], int(sys.argv[3])))"
)


def setup_logging(process_name):
    """Configure the root logger for one process; `process_name` appears in every line."""
    prefix = "(%s pid=%d) " % (process_name, os.getpid())
    formatter = logging.Formatter(
        prefix + "%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", datefmt="%m-%d %H:%M:%S"
    )
    to_stdout = logging.StreamHandler(sys.stdout)
    to_stdout.addFilter(lambda record: record.levelno < logging.ERROR)
    to_stderr = logging.StreamHandler(sys.stderr)
    to_stderr.setLevel(logging.ERROR)
    root = logging.getLogger()
    root.handlers[:] = []
    for handler in (to_stdout, to_stderr):
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(logging.INFO)


class SignalWaker:
    """Delivers watched signals as events readable from `fileno()`.

    Only one instance per process (signal.set_wakeup_fd is process-wide); it must be created in
    the main thread. Signals not watched keep their current disposition.
    """

    def __init__(self):
        self._reader, writer = socket.socketpair()
        self._writer = writer
        for sock in (self._reader, self._writer):
            sock.setblocking(False)
        signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self.pending = deque()

    def watch(self, *signums):
        """Route `signums` to this waker instead of their current disposition."""
        for signum in signums:
            signal.signal(signum, lambda _signum, _frame: None)

    def fileno(self):
        return self._reader.fileno()

    def collect(self):
        """Move signal numbers that arrived into `pending`."""
        try:
            data = self._reader.recv(4096)
        except BlockingIOError:
            return
        self.pending.extend(data)


class LineChannel:
    """One end of a socketpair carrying JSON objects, one per line."""

    def __init__(self, sock):
        self.sock = sock
        self._buffer = b""
        self.messages = deque()
        self.eof = False
        self.eof_reported = False

    def fileno(self):
        return self.sock.fileno()

    def send(self, message):
        """Send one JSON-serialisable object; raises OSError if the other end is gone."""
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def receive_available(self):
        """Read what is there (call when select reports the socket readable)."""
        try:
            data = self.sock.recv(65536)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        self.messages.extend(json.loads(line) for line in lines if line)


def next_event(waker, channels, timeout=None):
    """Wait for the next signal, channel message or channel EOF.

    Returns one of ("signal", signum), ("message", channel, obj), ("eof", channel) or
    ("timeout",) once `timeout` seconds (None: forever) have passed. Each channel's EOF is
    reported once; afterwards the channel is no longer watched.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if waker.pending:
            return ("signal", waker.pending.popleft())
        for channel in channels:
            if channel.messages:
                return ("message", channel, channel.messages.popleft())
            if channel.eof and not channel.eof_reported:
                channel.eof_reported = True
                return ("eof", channel)
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            return ("timeout",)
        watched = [waker] + [channel for channel in channels if not channel.eof]
        for source in select.select(watched, [], [], remaining)[0]:
            if source is waker:
                waker.collect()
            else:
                source.receive_available()


def spawn_child(title, sentinel=True):
    """Start a child process of this package titled `title` (e.g. "VLLM::EngineCore").

    The child inherits stdio and the environment. With `sentinel` (vLLM's processes: multiprocessing starts them) the
    two pipes multiprocessing leaves are kept as it does (CPython Lib/multiprocessing/popen_spawn_posix.py
    `Popen._launch`, popen_fork.py likewise): this process holds the read end of one whose write end the child
    holds (`Process.sentinel`, readable at EOF once the child is gone; vLLM's API server watches its engines
    through them, vllm/v1/engine/core_client.py `MPClient.start_engine_core_monitor`) and the write end of another
    whose read end the child holds (the child's parent sentinel). The raylet's actors are not multiprocessing's.
    Returns (subprocess.Popen, LineChannel to it).
    """
    parent_end, child_end = socket.socketpair()
    pipes = (os.pipe(), os.pipe()) if sentinel else ()
    child_fds = [pipes[0][1], pipes[1][0]] if sentinel else []
    with child_end:
        process = subprocess.Popen(
            [sys.executable, "-c", _CHILD_BOOTSTRAP, PACKAGE_PARENT, title, str(child_end.fileno())],
            pass_fds=(child_end.fileno(), *child_fds),
        )
    for fd in child_fds:
        os.close(fd)
    # Held for the child's life, as multiprocessing holds them until the Process object is gone.
    process.sentinels = (pipes[0][0], pipes[1][1]) if sentinel else ()
    return process, LineChannel(parent_end)


def process_title(name):
    """vLLM's process title for `name` ("EngineCore", "Worker_TP0"): prefix from VLLM_PROCESS_NAME_PREFIX."""
    from simvllm import facts

    return "%s::%s" % (os.environ.get("VLLM_PROCESS_NAME_PREFIX", facts.PROCESS_NAME_PREFIX), name)
