"""The tensor-parallel group the model being built belongs to, and its three collectives.

Layers read the group once, at build (`get_tp_group()`), and keep the collectives they need; a
model built outside a worker process gets `SINGLE` (one rank, no communication), so the
single-process path is unchanged. A tensor-parallel worker (worker/tp_worker.py) sets its group
with `set_tp_group` after `paddle.distributed.init_parallel_env()` and before building the model.

Collectives run on paddle.distributed's default group: gloo on CPU, NCCL on GPU.
"""
from __future__ import annotations

import paddle


class TensorParallelGroup:
    """rank in [0, size); the collectives are called by every rank in the same order."""

    def __init__(self, rank: int, size: int):
        if not 0 <= rank < size:
            raise ValueError(f"tensor-parallel rank {rank} is outside [0, {size})")
        self.rank, self.size = rank, size

    def all_reduce(self, x: paddle.Tensor) -> paddle.Tensor:
        """Element-wise sum of x over the ranks (x [any shape] float32, summed in place); returned."""
        paddle.distributed.all_reduce(x)
        return x

    def all_gather(self, x: paddle.Tensor, axis: int) -> paddle.Tensor:
        """Every rank's x ([..., d, ...], the same shape on each) concatenated along `axis` in rank order."""
        parts: list = []
        paddle.distributed.all_gather(parts, x)
        return paddle.concat(parts, axis=axis)

    def broadcast(self, x: paddle.Tensor, src: int = 0) -> paddle.Tensor:
        """x overwritten with rank `src`'s x (the same shape and dtype on every rank); returned."""
        paddle.distributed.broadcast(x, src=src)
        return x


SINGLE = TensorParallelGroup(0, 1)
_group = SINGLE


def get_tp_group() -> TensorParallelGroup:
    return _group


def set_tp_group(group: TensorParallelGroup) -> None:
    global _group
    _group = group
