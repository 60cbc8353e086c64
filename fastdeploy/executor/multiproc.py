"""MultiprocExecutor: the model over P x T worker processes, one per rank (worker/tp_worker.py):
P pipeline stages of T tensor-parallel ranks each.

The engine process keeps the scheduler; each step it pickles the SchedulerOutput once and sends it
to every rank, and returns the sampling rank's ModelRunnerOutput (the last stage's tp rank 0:
sampling happens there only, so the tokens depend on neither P nor T). With P > 1 up to P steps are
in flight (`submit` / `collect`): every rank takes the steps in order, so stage 1 computes step i
while stage 2 computes step i - 1. Workers are started with `python -m` (not multiprocessing's
spawn, which would re-run an unguarded user script), each with one end of a socket pair and the
paddle.distributed variables of its rank; they open the checkpoint themselves and load their shard.

Faults never hang the caller:
- every wait watches every rank's socket: a worker that dies closes its end, so its death is
  seen at once (EOF), named by rank (and stage), pid and exit status or signal;
- an error raised on one rank is reported with that rank's traceback; when every rank answered the
  step the executor stays usable (the engine rolls the step back), otherwise the others are stuck
  in a collective and the executor is broken; with pipeline stages or several nodes any error breaks it;
- a broken executor kills all its workers, and every later step raises the first failure again;
- start-up errors (a rank failing to join the group or to load) come back with the rank's traceback;
  an automatically chosen master port that another process took meanwhile (rank 0 checks it before
  Paddle's store binds it: the store aborts the process on a port in use), or a rendezvous whose
  connection between ranks was refused or timed out (gloo's ranks listen on ports of their own, which
  another process may hold or close in between; creating a stage's group timed out once in CI), is
  retried on a new one.
With `nnodes` > 1 only this node's ranks are started here; the other nodes' ranks connect to the
engine over TCP (distributed/engine_link.py) and are then served, and watched, as local ones.
`shutdown()` (also from `__del__` and at interpreter exit) asks the workers to exit and kills the
ones that have not within seconds; a worker also exits by itself when the engine process goes away.
A Ctrl-C while a step runs leaves the workers finishing it; its answers are read and dropped
before the next step.
"""
from __future__ import annotations

import atexit
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
import weakref
from multiprocessing.connection import Connection, wait
from typing import Optional

from fastdeploy.config import FDConfig
from fastdeploy.distributed.engine_link import ENGINE_PORT_OFFSET, accept_rank, listen
from fastdeploy.distributed.pipeline import describe_stages
from fastdeploy.distributed.sharding import TensorParallelShard
from fastdeploy.engine.sched.output import SchedulerOutput
from fastdeploy.executor.abstract import Executor
from fastdeploy.platforms.cpu import engine_threads
from fastdeploy.worker.output import ModelRunnerOutput

logger = logging.getLogger("fastdeploy")

ERROR_GRACE_S = 5.0  # after one rank's error, how long the others may take to answer before the executor is broken
SHUTDOWN_GRACE_S = 5.0  # how long workers may take to exit when asked, before they are killed
PORT_RETRIES = 3  # fresh automatic master ports tried when the chosen one was taken meanwhile
# start-up failures retried on a new automatic port: a port taken meanwhile, gloo's ranks failing to
# connect (refused, or a pair's connection timing out while a stage's group is created: seen in CI)
_RETRIED_ON_A_NEW_PORT = ("address already in use", "address in use", "errno 98", "connection refused",
                          "pair.cc")


class WorkerFailure(RuntimeError):
    """A tensor-parallel worker died or failed; the message names the rank."""


def free_port(host: str) -> int:
    """A TCP port nobody listens on at `host` now (the kernel's choice)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(host: str, port: int, what: str = "master_port") -> None:
    """ValueError naming the port (as `what`) when another process holds it at `host`."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError as e:
            raise ValueError(f"{what}={port} on {host} is in use ({e.strerror}); choose another master_port "
                             "or leave master_port unset to pick a free one") from None


class MultiprocExecutor(Executor):
    """`fd_config.world_size` worker processes (pipeline stages x tensor-parallel ranks) on this
    machine; see the module docstring.

    quant_config: the checkpoint's (for GGUF, checked to split on block boundaries; the workers
    read the checkpoint themselves); model_quant_config: what each rank builds its model with (the
    resolved weight format's: GGUF, packed bf16/wint8/wint4, or None for float32), checked for
    packed formats to suit every rank's shard. Raises ValueError for a split the checkpoint or the
    format does not allow or a master_port in use, before any worker starts; WorkerFailure (a
    RuntimeError) naming the rank when a worker fails to start.
    start_timeout_s: how long start-up (joining the group and loading) may take in all (None: no limit).
    """

    def __init__(self, fd_config: FDConfig, quant_config=None, model_quant_config=None,
                 start_timeout_s: Optional[float] = None):
        self.size = fd_config.world_size
        self.nnodes = fd_config.nnodes
        self.local_size = self.size // self.nnodes  # ranks 0 .. local_size - 1 run here, the rest on other nodes
        self.max_concurrent_batches = fd_config.pipeline_parallel_size  # one step per stage in flight
        self.tp_size = fd_config.tensor_parallel_size
        self.output_rank = self.size - self.tp_size  # the last stage's tp rank 0 samples
        tensor_types = getattr(quant_config, "tensor_types", None)  # GGUF: each quantized matrix's type
        packed_kind = getattr(model_quant_config, "kind", None)  # PackedConfig: bf16, wint8 or wint4
        for rank in range(self.tp_size):  # ValueError before any worker starts
            shard = TensorParallelShard(fd_config.model_config, rank, self.tp_size)
            if tensor_types:
                shard.check_quantized_split(tensor_types)
            if packed_kind is not None:
                shard.check_packed_split(packed_kind)
        self.model_quant_config = model_quant_config
        self.master_addr = fd_config.master_addr
        self._procs: list[subprocess.Popen] = []
        self._conns: list[Connection] = []
        self._failure: Optional[str] = None
        self._owed = [0] * self.size  # answers each rank owes us (messages sent, answers not read)
        self._steps_in_flight = 0  # submitted steps whose answers the engine still wants (collect)
        self._shut_down = False
        self.start_memory: list[int] = []  # each rank's resident bytes once loaded
        _LIVE.add(self)
        auto_port = fd_config.master_port is None
        if not auto_port:
            check_port_free(self.master_addr, fd_config.master_port)
        if self.nnodes > 1:  # where the other nodes' ranks connect
            check_port_free(self.master_addr, fd_config.master_port + ENGINE_PORT_OFFSET, "master_port + 1")
        if fd_config.pipeline_parallel_size > 1:
            logger.info("pipeline stages (decoder layers): %s",
                        describe_stages(fd_config.model_config.num_hidden_layers, fd_config.pipeline_parallel_size))
        for attempt in range(PORT_RETRIES if auto_port else 1):
            port = free_port(self.master_addr) if auto_port else fd_config.master_port
            try:
                self._start(fd_config, port, start_timeout_s)
                return
            except WorkerFailure as e:
                self._kill()
                transient = any(s in str(e).lower() for s in _RETRIED_ON_A_NEW_PORT)
                if not (auto_port and transient) or attempt == PORT_RETRIES - 1:
                    raise
            except BaseException:
                self._kill()
                raise

    # ---- start-up ------------------------------------------------------------------------------
    def _start(self, fd_config: FDConfig, port: int, timeout: Optional[float]) -> None:
        self._procs, self._conns, self._failure = [], [None] * self.size, None
        threads = max(1, engine_threads() // self.local_size)
        endpoints = ",".join(f"{self.master_addr}:{port + i}" for i in range(self.size))
        listener = listen(self.master_addr, port + ENGINE_PORT_OFFSET) if self.nnodes > 1 else None
        try:
            for rank in range(self.local_size):
                ours, theirs = socket.socketpair()
                env = dict(os.environ, PADDLE_TRAINER_ID=str(rank), PADDLE_TRAINERS_NUM=str(self.size),
                           MASTER_ADDR=self.master_addr, MASTER_PORT=str(port), PADDLE_TRAINER_ENDPOINTS=endpoints,
                           PADDLE_CURRENT_ENDPOINT=f"{self.master_addr}:{port + rank}", FD_LOCAL_RANK=str(rank),
                           OMP_NUM_THREADS=str(threads))
                with theirs:
                    proc = subprocess.Popen([sys.executable, "-m", "fastdeploy.worker.tp_worker", str(theirs.fileno())],
                                            pass_fds=[theirs.fileno()], env=env, start_new_session=True)
                self._procs.append(proc)
                self._conns[rank] = Connection(ours.detach())
                self._conns[rank].send((fd_config, self.model_quant_config, threads))
            if listener is not None:
                self._accept_other_nodes(listener, (fd_config, self.model_quant_config, None), timeout)
        finally:
            if listener is not None:
                listener.close()
        self._owed = [1] * self.size  # the ready message
        replies = self._collect(range(self.size), "start-up", timeout)
        self.start_memory = [replies[r] for r in range(self.local_size)]

    def _accept_other_nodes(self, listener: socket.socket, config: tuple, timeout: Optional[float]) -> None:
        """Accept the other nodes' ranks as they connect and send each the configuration (their own
        node's command sets their thread count); a local rank failing meanwhile ends the wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while None in self._conns:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait([listener] + self._conns[: self.local_size], left)
            if not ready:
                missing = [r for r, c in enumerate(self._conns) if c is None]
                self._fail(f"worker ranks {missing} of the other nodes did not connect within {timeout} s")
            if listener not in ready:  # a local rank answered before the others joined: its error
                self._owed = [1] * self.local_size + [0] * (self.size - self.local_size)
                self._collect([self._conns.index(ready[0])], "start-up")
            try:
                rank, conn = accept_rank(listener)
            except (OSError, EOFError, ValueError):
                continue  # not one of ours
            if not self.local_size <= rank < self.size or self._conns[rank] is not None:
                conn.close()
                continue
            self._conns[rank] = conn
            conn.send(config)

    # ---- the step ------------------------------------------------------------------------------
    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self._request(("step", scheduler_output), "step")[self.output_rank]

    def submit(self, scheduler_output: SchedulerOutput) -> None:
        """Send a step to every rank without waiting (pipeline parallelism: up to
        `max_concurrent_batches` steps in flight, each stage working on its own); `collect` returns the
        results in submission order."""
        self._send(("step", scheduler_output), "step")
        self._steps_in_flight += 1

    def collect(self) -> ModelRunnerOutput:
        """The result of the oldest submitted step (waits for it)."""
        replies = self._collect(range(self.size), "step")
        self._steps_in_flight -= 1
        return replies[self.output_rank]

    def drop_in_flight(self) -> None:
        """Stop waiting for the submitted steps (the engine was interrupted): their answers are read
        and dropped before the next message."""
        self._steps_in_flight = 0

    def worker_stats(self) -> list:
        """Every rank's WorkerStats (worker/tp_worker.py: resident and parameter bytes now, collectives'
        and pipeline sends' time, count and bytes so far), in rank order, other nodes' included."""
        replies = self._request(("stats",), "stats request")
        return [replies[r] for r in range(self.size)]

    def _request(self, message: tuple, what: str) -> dict:
        """Send `message` to every rank (pickled once); their answers {rank: payload}."""
        if self._steps_in_flight:
            raise RuntimeError(f"a {what} while {self._steps_in_flight} submitted steps are in flight")
        self._send(message, what)
        return self._collect(range(self.size), what)

    def _send(self, message: tuple, what: str) -> None:
        self._check_usable()
        while max(self._owed) > self._steps_in_flight:  # answers of an interrupted request come first
            self._collect([r for r in range(self.size) if self._owed[r] > self._steps_in_flight],
                          f"interrupted request before this {what}")
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        for rank, conn in enumerate(self._conns):
            try:
                conn.send_bytes(payload)
            except OSError:
                self._fail(self._describe_exit(rank))
            self._owed[rank] += 1

    def _collect(self, ranks, what: str, timeout: Optional[float] = None) -> dict:
        """Each rank's next answer {rank: payload}; WorkerFailure naming the rank on an error or a death."""
        pending = {self._conns[r]: r for r in ranks}
        replies, errors = {}, {}
        deadline = None if timeout is None else time.monotonic() + timeout
        while pending:
            if errors and deadline is None:
                deadline = time.monotonic() + ERROR_GRACE_S
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = wait(list(pending), left)
            if not ready:
                if errors:  # the other ranks are stuck in a collective the failed rank never joined
                    self._fail(self._error_message(what, errors))
                self._fail(f"workers {[self._name(r) for r in sorted(pending.values())]} gave no answer to the {what} "
                           f"within {timeout} s")
            for conn in ready:
                rank = pending.pop(conn)
                try:
                    status, payload = conn.recv()
                except (EOFError, OSError):
                    self._fail(self._describe_exit(rank))
                self._owed[rank] -= 1
                (errors if status == "error" else replies)[rank] = payload
        if errors:  # every rank answered: nobody is stuck, the executor stays usable, except at start-up,
            # across nodes and with pipeline stages (later steps in flight, later stages are stuck)
            if what == "start-up" or self.nnodes > 1 or self.max_concurrent_batches > 1:
                self._fail(self._error_message(what, errors))
            raise WorkerFailure(self._error_message(what, errors))
        return replies

    def _error_message(self, what: str, errors: dict) -> str:
        rank = next(iter(errors))  # the first to arrive: the others may only report its absence
        return f"{self._name(rank)} failed in the {what}:\n{errors[rank]}"

    def _name(self, rank: int) -> str:
        """How errors name a worker: its rank, and its pipeline stage when there are several."""
        if self.max_concurrent_batches == 1:
            return f"tensor-parallel worker rank {rank}"
        return f"worker rank {rank} (pipeline stage {rank // self.tp_size}, tensor-parallel rank {rank % self.tp_size})"

    def _describe_exit(self, rank: int) -> str:
        if rank >= self.local_size:
            return f"{self._name(rank)} on another node closed its connection (it died, or its node did)"
        proc = self._procs[rank]
        try:
            code = proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            return f"{self._name(rank)} (pid {proc.pid}) closed its connection"
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited with status {code}"
        return f"{self._name(rank)} (pid {proc.pid}) {how}"

    def _fail(self, message: str):
        """Break the executor: kill every worker and raise; later calls raise the same message."""
        self._failure = message
        self._kill()
        raise WorkerFailure(message)

    def _check_usable(self) -> None:
        if self._shut_down:
            raise RuntimeError("the executor was shut down")
        if self._failure is not None:
            raise WorkerFailure(f"the workers are gone ({self._failure}); create a new LLM")

    # ---- lifecycle -----------------------------------------------------------------------------
    def check_health(self) -> None:
        self._check_usable()
        for rank, proc in enumerate(self._procs):
            if proc.poll() is not None:
                self._fail(self._describe_exit(rank))

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def shutdown(self) -> None:
        """Ask every worker to exit, kill those still running after SHUTDOWN_GRACE_S; idempotent."""
        if self._shut_down:
            return
        self._shut_down = True
        for conn in self._conns:
            try:
                conn.send(("shutdown",))
            except (OSError, AttributeError):  # (None: a rank that never connected)
                pass
        deadline = time.monotonic() + SHUTDOWN_GRACE_S
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self._kill()

    def _kill(self) -> None:
        """SIGKILL every worker still running, reap them all and close the connections."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
        for proc in self._procs:
            proc.wait()
        for conn in self._conns:
            if conn is not None:
                conn.close()
        self._conns = []

    def __del__(self):
        try:
            self.shutdown()
        except Exception:
            pass


_LIVE: "weakref.WeakSet[MultiprocExecutor]" = weakref.WeakSet()


@atexit.register
def _shutdown_all() -> None:
    """Interpreter exit: no worker outlives the engine process."""
    for executor in list(_LIVE):
        executor.shutdown()
