"""The rank groups the model being built belongs to: its tensor-parallel group (three collectives)
and its pipeline stage (which layers it holds, and the hidden states passed to the next stage).

Layers read them once, at build (`get_tp_group()`, `get_pp_stage()`), and keep what they need; a
model built outside a worker process gets `SINGLE` and `SINGLE_STAGE` (one rank, every layer, no
communication), so the single-process path is unchanged. A worker (worker/tp_worker.py) sets both
after `paddle.distributed.init_parallel_env()` and before building the model.

Ranks are laid out stage-major (vLLM's order): global rank = stage x tensor_parallel_size + tp rank.
Collectives run on paddle.distributed (gloo on CPU, NCCL on GPU) on the group of a stage's ranks;
the hidden states go from each tp rank to the same tp rank of the next stage (every tp rank holds
the whole hidden state after its all-reduce) over the stage's link (distributed/pipeline.py).
"""
from __future__ import annotations

import time

import paddle


class TensorParallelGroup:
    """rank in [0, size); the collectives are called by every rank in the same order. `first_rank`:
    the global rank of tp rank 0 (the stage's first); `group`: paddle.distributed's group of the
    ranks, None for the default group (every rank of the world).

    `comm_seconds` / `comm_calls` add up the wall time spent in the collectives (waiting for the
    slowest rank included) and their count, for benchmarks/ to report the communication cost."""

    def __init__(self, rank: int, size: int, first_rank: int = 0, group=None):
        if not 0 <= rank < size:
            raise ValueError(f"tensor-parallel rank {rank} is outside [0, {size})")
        self.rank, self.size = rank, size
        self.first_rank, self.group = first_rank, group
        self.comm_seconds, self.comm_calls = 0.0, 0

    def all_reduce(self, x: paddle.Tensor) -> paddle.Tensor:
        """Element-wise sum of x over the ranks (x [any shape] float32, summed in place); returned."""
        start = time.perf_counter()
        paddle.distributed.all_reduce(x, group=self.group)
        self._count(start)
        return x

    def all_gather(self, x: paddle.Tensor, axis: int) -> paddle.Tensor:
        """Every rank's x ([..., d, ...], the same shape on each) concatenated along `axis` in rank order."""
        start = time.perf_counter()
        parts: list = []
        paddle.distributed.all_gather(parts, x, group=self.group)
        self._count(start)
        return paddle.concat(parts, axis=axis)

    def broadcast(self, x: paddle.Tensor, src: int = 0) -> paddle.Tensor:
        """x overwritten with tp rank `src`'s x (the same shape and dtype on every rank); returned."""
        start = time.perf_counter()
        paddle.distributed.broadcast(x, src=self.first_rank + src, group=self.group)
        self._count(start)
        return x

    def _count(self, start: float) -> None:
        self.comm_seconds += time.perf_counter() - start
        self.comm_calls += 1


def stage_layers(num_layers: int, num_stages: int) -> list[range]:
    """The contiguous layer range of each of `num_stages` pipeline stages. Layers that do not divide go
    one each to the stages before the last, from the second-to-last backwards (vLLM's split: the first
    stage also embeds and the last computes the logits). ValueError when a stage would get none."""
    if not 1 <= num_stages <= num_layers:
        raise ValueError(f"pipeline_parallel_size={num_stages} must be between 1 and the model's "
                         f"num_hidden_layers={num_layers} (every stage holds at least one layer)")
    counts = [num_layers // num_stages] * num_stages
    for i in range(num_layers % num_stages):
        counts[-2 - i] += 1
    starts = [sum(counts[:i]) for i in range(num_stages)]
    return [range(start, start + count) for start, count in zip(starts, counts)]


class PipelineStage:
    """Stage `index` of `size`, holding decoder layers `layers` (the embedding on the first stage, the
    final norm and lm_head on the last). `link`: how the runner receives the previous stage's hidden
    states and sends its own on (distributed/pipeline.py `StageLink`; None with one stage)."""

    def __init__(self, index: int, size: int, layers: range, link=None):
        self.index, self.size, self.layers, self.link = index, size, layers, link

    @property
    def is_first(self) -> bool:
        return self.index == 0

    @property
    def is_last(self) -> bool:
        return self.index == self.size - 1


SINGLE = TensorParallelGroup(0, 1)
_group = SINGLE
SINGLE_STAGE = PipelineStage(0, 1, range(0, 1 << 30))  # every layer
_stage = SINGLE_STAGE


def get_tp_group() -> TensorParallelGroup:
    return _group


def set_tp_group(group: TensorParallelGroup) -> None:
    global _group
    _group = group


def get_pp_stage() -> PipelineStage:
    return _stage


def set_pp_stage(stage: PipelineStage) -> None:
    global _stage
    _stage = stage
