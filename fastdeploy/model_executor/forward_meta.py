"""ForwardMeta: the batch metadata of one model step, as the model and attention see it (no requests).

The step's tokens are flattened into one ragged batch: request i owns tokens
cu_seqlens_q[i]:cu_seqlens_q[i+1]. The token ids (or embeddings) and positions are the model's
arguments, not fields here: positions are RoPE positions (`[3, num_tokens]` for M-RoPE), which are
not cache positions, so the cache slots are derived from `seq_lens_decoder` alone.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np
import paddle


@dataclass
class ForwardMeta:
    seq_lens_this_time: np.ndarray  # [bs] int64 tokens scheduled for each request (prompt chunk or 1)
    seq_lens_decoder: np.ndarray  # [bs] int64 tokens already in the KV cache before this step
    cu_seqlens_q: np.ndarray  # [bs + 1] int64 prefix sums of seq_lens_this_time
    block_tables: np.ndarray  # [bs, max_blocks] int64 physical block ids, -1 padded
    slot_mapping: np.ndarray  # [num_tokens] int64 cache slot of each new token = block * block_size + offset
    caches: list  # [num_layers] KVCache (layers/attention.py), allocated by the model runner
    # [num_tokens] int64 modality of each token (0 text, 1 image, 2 video, as FastDeploy), None for text
    # only; handed to the MoE layers, which may route on it
    token_type_ids: Optional[paddle.Tensor] = None
    attn_metadata: object = None  # set by the model's attention backend at the start of its forward

    @classmethod
    def build(
        cls,
        seq_lens_this_time: list[int],
        seq_lens_decoder: list[int],
        block_tables: list[list[int]],
        block_size: int,
        caches: list,
        token_type_ids: Optional[paddle.Tensor] = None,
    ) -> "ForwardMeta":
        """The metadata of a step; token t of request i goes to cache position seq_lens_decoder[i] + t."""
        bs = len(seq_lens_this_time)
        max_blocks = max(len(b) for b in block_tables)
        table = np.full((bs, max_blocks), -1, dtype=np.int64)
        for i, blocks in enumerate(block_tables):
            table[i, : len(blocks)] = blocks
        this_time = np.asarray(seq_lens_this_time, dtype=np.int64)
        decoder = np.asarray(seq_lens_decoder, dtype=np.int64)
        cu = np.zeros(bs + 1, dtype=np.int64)
        np.cumsum(this_time, out=cu[1:])
        request_of_token = np.repeat(np.arange(bs), this_time)  # [num_tokens]
        cache_pos = decoder[request_of_token] + np.arange(cu[-1]) - cu[request_of_token]  # [num_tokens]
        slots = table[request_of_token, cache_pos // block_size] * block_size + cache_pos % block_size
        return cls(
            seq_lens_this_time=this_time,
            seq_lens_decoder=decoder,
            cu_seqlens_q=cu,
            block_tables=table,
            slot_mapping=slots,
            caches=caches,
            token_type_ids=token_type_ids,
        )
