"""The tensor-parallel group the model being built belongs to, and its three collectives.

Layers read the group once, at build (`get_tp_group()`), and keep the collectives they need; a
model built outside a worker process gets `SINGLE` (one rank, no communication), so the
single-process path is unchanged. A tensor-parallel worker (worker/tp_worker.py) sets its group
with `set_tp_group` after `paddle.distributed.init_parallel_env()` and before building the model.

Collectives run on paddle.distributed's default group: gloo on CPU, NCCL on GPU.
"""
from __future__ import annotations

import time

import paddle


class TensorParallelGroup:
    """rank in [0, size); the collectives are called by every rank in the same order.

    `comm_seconds` / `comm_calls` add up the wall time spent in the collectives (waiting for the
    slowest rank included) and their count, for benchmarks/ to report the communication cost."""

    def __init__(self, rank: int, size: int):
        if not 0 <= rank < size:
            raise ValueError(f"tensor-parallel rank {rank} is outside [0, {size})")
        self.rank, self.size = rank, size
        self.comm_seconds, self.comm_calls = 0.0, 0

    def all_reduce(self, x: paddle.Tensor) -> paddle.Tensor:
        """Element-wise sum of x over the ranks (x [any shape] float32, summed in place); returned."""
        start = time.perf_counter()
        paddle.distributed.all_reduce(x)
        self._count(start)
        return x

    def all_gather(self, x: paddle.Tensor, axis: int) -> paddle.Tensor:
        """Every rank's x ([..., d, ...], the same shape on each) concatenated along `axis` in rank order."""
        start = time.perf_counter()
        parts: list = []
        paddle.distributed.all_gather(parts, x)
        self._count(start)
        return paddle.concat(parts, axis=axis)

    def broadcast(self, x: paddle.Tensor, src: int = 0) -> paddle.Tensor:
        """x overwritten with rank `src`'s x (the same shape and dtype on every rank); returned."""
        start = time.perf_counter()
        paddle.distributed.broadcast(x, src=src)
        self._count(start)
        return x

    def _count(self, start: float) -> None:
        self.comm_seconds += time.perf_counter() - start
        self.comm_calls += 1


SINGLE = TensorParallelGroup(0, 1)
_group = SINGLE


def get_tp_group() -> TensorParallelGroup:
    return _group


def set_tp_group(group: TensorParallelGroup) -> None:
    global _group
    _group = group
