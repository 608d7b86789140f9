"""A Ray-like node daemon for the simulated vLLM's `--distributed-executor-backend ray`.

With the Ray executor, vLLM 0.33's workers are Ray actors (vllm/v1/executor/ray_executor_v2.py RayExecutorV2:
`ray.remote(RayWorkerProc)`), that is processes started by the node's raylet, not children of EngineCore. A stop by
session or by process tree of the vLLM instance therefore misses them, and the raylet is their owner. This daemon
models that, and no more:

- it listens on the unix socket named by RAY_ADDRESS (here a path; Ray's is an address);
- a job (an EngineCore) connects and sends {"event": "job", "workers": [worker config, ...]}; the raylet starts one
  worker process per entry, as its own child, titled `ray::RayWorkerProc.run` (Ray titles an actor process
  `ray::<class>.<method>` while it runs a method; RayWorkerProc.run is vLLM's busy loop), and answers
  {"event": "ready"} once every worker holds its GPU;
- "warm" and "shutdown" from the job are passed on to its workers;
- a worker that dies while its job is connected is started again 1 s later (an actor restart: the raylet is a
  respawning owner), at most RESTARTS times per worker;
- when the job's connection closes (EngineCore exited or was killed), the raylet ends the job's workers:
  SIGTERM, then SIGKILL after 4 s;
- SIGTERM/SIGINT to the raylet (`ray stop`): every worker is ended the same way, then it exits 0.

Start it with `python3 -m simvllm.raylet SOCKET` (tests/sim on sys.path); its command line is that of Ray's
raylet binary (`.../ray/core/src/ray/raylet/raylet --raylet_socket_name=SOCKET`) and its comm `raylet`.
"""

import ctypes
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import time

from simvllm import facts
from simvllm.runtime import LineChannel, SignalWaker, setup_logging, spawn_child

RAYLET_BINARY = "/usr/local/lib/python3/dist-packages/ray/core/src/ray/raylet/raylet"
WORKER_TITLE = "ray::RayWorkerProc.run"
RESTART_DELAY_S = 1.0
RESTARTS = 3

logger = logging.getLogger(__name__)


class Job:
    def __init__(self, channel):
        self.channel = channel
        self.configs = []
        self.workers = {}  # LineChannel -> (Popen, config)
        self.ready = set()
        self.announced = False
        self.warm = False
        self.restarts = {}  # rank -> restarts so far


class Raylet:
    def __init__(self, address):
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        if os.path.exists(address):
            os.unlink(address)
        self.listener.bind(address)
        self.listener.listen(16)
        self.address = address
        self.jobs = []
        self.pending = []  # (due, job, config): restarts to do
        self.waker = SignalWaker()
        self.waker.watch(signal.SIGTERM, signal.SIGINT)

    def start_worker(self, job, config):
        process, channel = spawn_child(WORKER_TITLE, sentinel=False)
        channel.send(
            dict(
                config,
                role="worker",
                title=WORKER_TITLE,
                workers_ignore_sigterm=config.get("workers_ignore_sigterm", False),
            )
        )
        job.workers[channel] = (process, config)
        if job.warm:
            channel.send({"event": "warm"})
        logger.info("Started actor RayWorkerProc rank %d as PID %d", config["rank"], process.pid)

    def end_workers(self, job):
        processes = [process for process, _config in job.workers.values()]
        job.workers.clear()
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + facts.WORKER_SIGTERM_WAIT
        for process in processes:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def on_job_message(self, job, message):
        if message.get("event") == "job":
            job.configs = message["workers"]
            for config in job.configs:
                self.start_worker(job, config)
        elif message.get("event") in ("warm", "shutdown"):
            job.warm = job.warm or message["event"] == "warm"
            for channel in list(job.workers):
                try:
                    channel.send(message)
                except OSError:
                    pass

    def on_worker_event(self, job, channel):
        if channel.messages:
            channel.messages.popleft()
            job.ready.add(job.workers[channel][1]["rank"])
            if len(job.ready) == len(job.configs) and not job.announced:
                job.announced = True
                job.channel.send({"event": "ready"})
            return
        process, config = job.workers.pop(channel)
        process.wait()
        done = job.restarts.get(config["rank"], 0)
        if not job.channel.eof and done < RESTARTS:
            job.restarts[config["rank"]] = done + 1
            logger.warning(
                "Actor RayWorkerProc rank %d (PID %d) died: restarting it in %.0f s",
                config["rank"],
                process.pid,
                RESTART_DELAY_S,
            )
            self.pending.append((time.monotonic() + RESTART_DELAY_S, job, config))
        elif not job.channel.eof:
            logger.error("Actor RayWorkerProc rank %d died %d times: not restarted", config["rank"], done + 1)

    def run(self):
        while True:
            sources = [self.waker, self.listener]
            for job in self.jobs:
                sources.append(job.channel)
                sources.extend(job.workers)
            timeout = min([1.0] + [max(0.0, due - time.monotonic()) for due, _job, _config in self.pending])
            for source in select.select(sources, [], [], timeout)[0]:
                if source is self.waker:
                    self.waker.collect()
                elif source is self.listener:
                    self.jobs.append(Job(LineChannel(self.listener.accept()[0])))
                else:
                    source.receive_available()
            if self.waker.pending:
                logger.info("Received signal %d: ending every actor.", self.waker.pending.popleft())
                for job in self.jobs:
                    self.end_workers(job)
                os.unlink(self.address)
                return 0
            self._dispatch()

    def _dispatch(self):
        for entry in [entry for entry in self.pending if entry[0] <= time.monotonic()]:
            self.pending.remove(entry)
            if entry[1] in self.jobs:
                self.start_worker(entry[1], entry[2])
        for job in list(self.jobs):
            while job.channel.messages:
                self.on_job_message(job, job.channel.messages.popleft())
            for channel in list(job.workers):
                while channel in job.workers and (channel.messages or channel.eof):
                    self.on_worker_event(job, channel)
            if job.channel.eof:
                logger.info("Job driver gone: ending its %d actor(s).", len(job.workers))
                self.end_workers(job)
                self.jobs.remove(job)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    address = argv[0] if argv else os.environ["RAY_ADDRESS"]
    import setproctitle

    setproctitle.setproctitle("%s --raylet_socket_name=%s" % (RAYLET_BINARY, address))
    ctypes.CDLL(None, use_errno=True).prctl(15, ctypes.c_char_p(b"raylet"), 0, 0, 0)  # PR_SET_NAME
    setup_logging("raylet")
    return Raylet(address).run()


if __name__ == "__main__":
    sys.exit(main())
