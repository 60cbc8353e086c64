"""Data-parallel batch workers on Ray: `run_batch --data-parallel-size N [--ray-address ADDR]`.

`RayWorkers` has the shape of `LocalWorker` (`process(requests) -> Iterator[record]`,
`shutdown()`), so the runner uses either the same way. It starts N Ray actors, each holding one
`LocalWorker` (one LLM), cuts the requests into chunks of `CHUNK_SIZE`, keeps up to
`CHUNKS_IN_FLIGHT` chunks queued on every actor (one running, one waiting, so an actor never idles
while the driver writes), and yields the records of each chunk as soon as the chunk comes back.
Records therefore come in completion order, not input order; each carries its `custom_id`.

One output file, written by the driver. The actors never touch the file system: they return
records to the driver, and the runner appends them to the single output file as they arrive. So
the output is one valid JSONL file whatever N is, nothing has to be merged, and the resume rule of
the single-process runner holds unchanged: a request is done when its record is in the file. A
crash (of the driver or of any actor) loses at most the chunks in flight, at most
`N * CHUNKS_IN_FLIGHT * CHUNK_SIZE` requests, and the next run with the same output file redoes
exactly those.

Threads. Each actor reserves `max(1, C // N)` Ray CPUs (C: the CPUs of the Ray cluster) and gets
`OMP_NUM_THREADS` set to the same number in its runtime environment; `fastdeploy.platforms.cpu`
reads that variable when fastdeploy is imported in the actor and gives the engine that many
threads. N actors on one machine therefore share its cores instead of each starting one thread
per core.

Errors. A dead actor (killed, out of memory, its node lost) or an exception escaping an actor's
`LocalWorker.process` (which handles bad requests itself, so this is a bug or an infrastructure
failure) makes `process` raise RuntimeError naming the actor; the driver waits with a timeout loop
and never hangs on a dead actor. Ray missing raises ImportError with the install command.
"""
from __future__ import annotations

import os
import uuid
from collections import deque
from typing import Iterable, Iterator, Optional

from fastdeploy.engine.args_utils import EngineArgs

CHUNK_SIZE = 32  # requests per actor call
CHUNKS_IN_FLIGHT = 2  # chunks queued on each actor at a time
WAIT_POLL_S = 1.0  # how long one ray.wait blocks before the loop checks again


def import_ray():
    """Import ray, or raise ImportError saying how to install it."""
    try:
        import ray
    except ImportError as e:
        raise ImportError(
            "data-parallel batch runs need Ray, which is not installed: pip install \"fastdeploy[ray]\""
        ) from e
    return ray


class _BatchActor:
    """The body of one Ray actor: one LocalWorker (one LLM) in the actor's process."""

    def __init__(self, engine_kwargs: dict):
        from fastdeploy.entrypoints.batch.local_worker import LocalWorker

        self.worker = LocalWorker(engine_kwargs)

    def info(self) -> dict:
        """pid, OMP_NUM_THREADS and the thread count the engine chose (fastdeploy.platforms.cpu)."""
        from fastdeploy.platforms import cpu

        omp = os.environ.get("OMP_NUM_THREADS")
        threads = cpu.engine_threads()
        return {"pid": os.getpid(), "omp_num_threads": omp, "engine_threads": threads}

    def process(self, requests: list) -> list[dict]:
        """The output records of one chunk (LocalWorker.process collected into a list)."""
        return list(self.worker.process(requests))

    def shutdown(self) -> None:
        self.worker.shutdown()


class RayWorkers:
    """N LocalWorkers in N Ray actors; see the module docstring.

    engine_kwargs: the `LLM(...)` keywords every actor's LocalWorker gets.
    data_parallel_size: N >= 1 actors.
    ray_address: the Ray cluster to join (`ray.init(address=...)`, e.g. "auto" or
        "ray://head:10001") when Ray is not initialised yet; None starts a local instance.
    Raises ImportError without ray; TypeError / ValueError for bad engine settings (checked here,
    before Ray starts), N < 1 or more actors than cluster CPUs; RuntimeError naming the actor
    when one fails to start (a model missing on its node: Ray's message carries the traceback).
    The constructor returns once every actor has loaded its model.
    """

    def __init__(self, engine_kwargs: dict, data_parallel_size: int, ray_address: Optional[str] = None):
        if not isinstance(data_parallel_size, int) or data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be an int >= 1, got {data_parallel_size!r}")
        settings = dict(engine_kwargs)
        EngineArgs.from_kwargs(settings.pop("model", None), settings)  # bad settings fail here, not in N actors
        ray = import_ray()
        self._ray = ray
        self._owns_ray = False
        self._actors: list = []
        if not ray.is_initialized():
            ray.init(address=ray_address)
            self._owns_ray = True
        try:
            cpus = int(ray.cluster_resources().get("CPU", 0))
            if data_parallel_size > cpus:
                raise ValueError(
                    f"data_parallel_size {data_parallel_size} needs one Ray CPU per actor, "
                    f"the Ray cluster has {cpus}"
                )
            self.cpus_per_actor = max(1, cpus // data_parallel_size)
            remote_cls = ray.remote(_BatchActor)
            tag = uuid.uuid4().hex[:8]
            self.names = [f"fastdeploy-batch-{tag}-{i}" for i in range(data_parallel_size)]
            env = {"OMP_NUM_THREADS": str(self.cpus_per_actor)}
            self._actors = [
                remote_cls.options(name=name, num_cpus=self.cpus_per_actor, max_restarts=0,
                                   runtime_env={"env_vars": env}).remote(dict(engine_kwargs))
                for name in self.names
            ]
            # wait for every engine to load, so a bad model or setting fails here, before any work
            self.actor_info = [self._get(actor.info.remote(), i, "starting")
                               for i, actor in enumerate(self._actors)]
        except BaseException:
            self.shutdown()
            raise

    def _get(self, ref, index: int, doing: str):
        """ray.get of one actor call, with a dead actor or an escaped exception as RuntimeError."""
        ray = self._ray
        while True:
            ready, _ = ray.wait([ref], timeout=WAIT_POLL_S)
            if ready:
                break
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(
                f"Ray actor {self.names[index]} (data-parallel rank {index} of {len(self.names)}) "
                f"died while {doing}: {e}"
            ) from e
        except ray.exceptions.RayTaskError as e:
            raise RuntimeError(
                f"Ray actor {self.names[index]} (data-parallel rank {index} of {len(self.names)}) "
                f"failed while {doing}: {e}"
            ) from e

    def process(self, requests: Iterable) -> Iterator[dict]:
        """Yield one output record per request (completion order) as each chunk finishes.

        requests: an iterable of BatchRequests. Raises RuntimeError naming the actor when one dies;
        the records of chunks that finished before have been yielded (the runner has written them).
        """
        if not self._actors:
            raise RuntimeError("RayWorkers.process called after shutdown()")
        requests = list(requests)
        waiting = deque(requests[i:i + CHUNK_SIZE] for i in range(0, len(requests), CHUNK_SIZE))
        in_flight: dict = {}  # ObjectRef -> (actor index, chunk)
        load = [0] * len(self._actors)

        def submit() -> None:
            # fill each actor up to CHUNKS_IN_FLIGHT, least loaded first
            while waiting:
                index = min(range(len(load)), key=load.__getitem__)
                if load[index] >= CHUNKS_IN_FLIGHT:
                    return
                chunk = waiting.popleft()
                in_flight[self._actors[index].process.remote(chunk)] = (index, chunk)
                load[index] += 1

        submit()
        while in_flight:
            ready, _ = self._ray.wait(list(in_flight), num_returns=1, timeout=WAIT_POLL_S)
            for ref in ready:
                index, chunk = in_flight.pop(ref)
                load[index] -= 1
                doing = (f"processing a chunk of {len(chunk)} requests "
                         f"(custom_id {chunk[0].custom_id!r} to {chunk[-1].custom_id!r})")
                records = self._get(ref, index, doing)
                submit()  # keep the actors busy while the caller writes these records
                yield from records

    def shutdown(self) -> None:
        """Kill the actors; shut Ray down only if this object started it. Safe to call twice."""
        for actor in self._actors:
            try:
                self._ray.kill(actor, no_restart=True)
            except Exception:  # already dead
                pass
        self._actors = []
        if self._owns_ray and self._ray.is_initialized():
            self._ray.shutdown()
        self._owns_ray = False
