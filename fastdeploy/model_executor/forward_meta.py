"""ForwardMeta: the batch of one model step, as the model and attention see it (no requests).

The step's tokens are flattened into one ragged batch: request i owns tokens
cu_seqlens_q[i]:cu_seqlens_q[i+1]. Arrays that every layer needs are built once per step here.
"""
from dataclasses import dataclass

import numpy as np
import paddle


@dataclass
class ForwardMeta:
    input_ids: paddle.Tensor  # [num_tokens] int64
    positions: paddle.Tensor  # [num_tokens] int64, position of each token in its sequence
    seq_lens_this_time: np.ndarray  # [bs] tokens scheduled for each request (prompt chunk or 1)
    seq_lens_decoder: np.ndarray  # [bs] tokens already in the KV cache before this step
    cu_seqlens_q: np.ndarray  # [bs + 1] prefix sums of seq_lens_this_time
    block_tables: np.ndarray  # [bs, max_blocks] physical block ids, -1 padded
    slot_mapping: np.ndarray  # [num_tokens] cache slot of each new token = block * block_size + offset
    logits_indices: paddle.Tensor  # [num_sampled] flattened token rows that produce logits
    attn_metadata: object = None  # built by the attention backend once per step

    @classmethod
    def build(
        cls,
        input_ids: list[int],
        positions: np.ndarray,
        seq_lens_this_time: list[int],
        seq_lens_decoder: list[int],
        block_tables: list[list[int]],
        block_size: int,
        logits_indices: list[int],
    ) -> "ForwardMeta":
        bs = len(seq_lens_this_time)
        max_blocks = max(len(b) for b in block_tables)
        table = np.full((bs, max_blocks), -1, dtype=np.int64)
        for i, blocks in enumerate(block_tables):
            table[i, : len(blocks)] = blocks
        this_time = np.asarray(seq_lens_this_time, dtype=np.int64)
        cu = np.zeros(bs + 1, dtype=np.int64)
        np.cumsum(this_time, out=cu[1:])
        request_of_token = np.repeat(np.arange(bs), this_time)
        slots = table[request_of_token, positions // block_size] * block_size + positions % block_size
        return cls(
            input_ids=paddle.to_tensor(np.asarray(input_ids, dtype=np.int64)),
            positions=paddle.to_tensor(positions),
            seq_lens_this_time=this_time,
            seq_lens_decoder=np.asarray(seq_lens_decoder, dtype=np.int64),
            cu_seqlens_q=cu,
            block_tables=table,
            slot_mapping=slots,
            logits_indices=paddle.to_tensor(np.asarray(logits_indices, dtype=np.int64)),
        )
