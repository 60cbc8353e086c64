"""The vocabulary-parallel pieces of a tensor-parallel model (distributed/sharding.py says who holds what).

Rank r holds vocabulary rows [r * L, (r + 1) * L) of the embedding and of lm_head, L = ceil(V / N),
the last rank's tail padded with zero rows:
- `VocabParallelEmbedding`: each rank looks up the ids in its range (zeros for the others) and
  an all-reduce sums the ranks' rows, giving every rank the full embedding (Megatron-LM's
  VocabParallelEmbedding). Tied to a packed or GGUF-block lm_head, it holds no weight and reads the rows of
  this rank's lm_head copy (layers/embeddings.py TiedEmbedding), the values one process reads.
- `gather_logits`: each rank's lm_head gives logits for its L columns; all ranks gather them in
  rank order and cut the padding, so every rank holds the [m, V] logits sampling reads.
"""
from typing import Optional

import paddle
import paddle.nn.functional as F

from fastdeploy.distributed.parallel_state import TensorParallelGroup
from fastdeploy.model_executor.layers.embeddings import TiedEmbedding
from fastdeploy.model_executor.layers.parameters import empty_parameter


def local_vocab_size(vocab_size: int, group: TensorParallelGroup) -> int:
    """L = ceil(vocab_size / ranks): the vocabulary rows each rank holds (padding included)."""
    return -(-vocab_size // group.size)


class VocabParallelEmbedding(paddle.nn.Layer):
    """weight [L, hidden] float32: this rank's rows of the [vocab_size, hidden] embedding; with `tied`
    (the rank's packed or GGUF-block lm_head, whose L rows are these), no weight: its rows are read."""

    def __init__(self, vocab_size: int, hidden_size: int, group: TensorParallelGroup,
                 tied: Optional[TiedEmbedding] = None):
        super().__init__()
        self.local_vocab = local_vocab_size(vocab_size, group)
        self.tied = tied
        if tied is None:
            self.weight = empty_parameter([self.local_vocab, hidden_size])
        self.group = group
        self.start = group.rank * self.local_vocab

    def forward(self, input_ids: paddle.Tensor) -> paddle.Tensor:
        # input_ids [n] int64 (full vocabulary) -> [n, hidden]
        local = input_ids - self.start
        mine = paddle.logical_and(local >= 0, local < self.local_vocab)  # [n]
        ids = paddle.where(mine, local, paddle.zeros_like(local))
        rows = F.embedding(ids, self.weight) if self.tied is None else self.tied(ids)
        rows = rows * mine.astype(rows.dtype).unsqueeze(1)
        return self.group.all_reduce(rows)


def gather_logits(local_logits: paddle.Tensor, group: TensorParallelGroup, vocab_size: int) -> paddle.Tensor:
    """[m, L] logits of this rank's vocabulary rows -> [m, vocab_size], the same on every rank."""
    return group.all_gather(local_logits, axis=1)[:, :vocab_size]
