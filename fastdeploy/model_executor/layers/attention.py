"""Paged attention, pure-Paddle backend (the reference for compiled `append_attention` ops).

One call per layer: write this step's K/V into the paged cache by slot mapping, then attend each
request's new query tokens over everything its sequence has in the cache, causally.

KV cache per layer: key/value `[num_blocks, kv_heads, block_size, head_dim]` (FastDeploy's layout),
held as numpy arrays viewed as `[num_blocks * kv_heads, block_size, head_dim]`: one (block, kv head)
pair is one contiguous row, so gathering a sequence's history is a single row gather whose result
is already `[kv_heads, blocks * block_size, head_dim]`. The gathers and cache writes run in numpy
(shared with Paddle through DLPack, no copies) because Paddle's CPU gather moves ~2.5 GB/s, a
fifth of numpy's; the arithmetic runs in Paddle.

Decode requests (one query token; the model runner puts them first in the batch) are attended
together in one batched matmul; prefill requests (prompt chunks) one at a time, in query blocks of `PREFILL_QUERY_BLOCK` rows to bound the score
matrix. Decode never goes through `scaled_dot_product_attention` (its CPU kernel is 3x slower at
query length 1).
"""
from dataclasses import dataclass

import numpy as np
import paddle
import paddle.nn.functional as F

from fastdeploy.cache_manager.block_pool import NULL_BLOCK_ID
from fastdeploy.model_executor.forward_meta import ForwardMeta

PREFILL_QUERY_BLOCK = 1024


def _as_paddle(array: np.ndarray) -> paddle.Tensor:
    return paddle.utils.dlpack.from_dlpack(array)


def _as_numpy(tensor: paddle.Tensor) -> np.ndarray:
    return np.from_dlpack(tensor)


@dataclass
class PrefillItem:
    token_start: int  # first row of this request in the flattened batch
    num_tokens: int  # query tokens this step
    gather_rows: np.ndarray  # [kv_heads * num_blocks] cache rows of its sequence
    mask: np.ndarray  # [num_tokens, num_blocks * block_size] additive causal mask (0 / -inf)


@dataclass
class AttentionMetadata:
    write_slots: np.ndarray  # [num_tokens * kv_heads] row of each new (token, kv head) in the flat cache
    num_decode: int  # requests with one query token; they come first in the batch
    decode_gather_rows: np.ndarray  # [num_decode * kv_heads * max_blocks]
    decode_mask: paddle.Tensor  # [num_decode, kv_heads, group, max_blocks * block_size]
    prefills: list[PrefillItem]
    num_decode_blocks: int


def _gather_rows(block_table: np.ndarray, kv_heads: int) -> np.ndarray:
    """Cache rows for blocks [..., nb] -> [..., kv_heads, nb] flattened; -1 padding -> null block."""
    blocks = np.where(block_table < 0, NULL_BLOCK_ID, block_table)
    heads = np.arange(kv_heads, dtype=np.int64)
    return (blocks[..., None, :] * kv_heads + heads[:, None]).reshape(-1)


class PaddleAttentionBackend:
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int):
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.group = num_heads // num_kv_heads
        self.scale = head_dim**-0.5

    def init_attention_metadata(self, meta: ForwardMeta) -> AttentionMetadata:
        """Per-step indices and masks shared by every layer."""
        kvh, bs = self.num_kv_heads, self.block_size
        slots = meta.slot_mapping
        rows = (slots // bs)[:, None] * kvh + np.arange(kvh)[None, :]  # [num_tokens, kv_heads]
        write_slots = (rows * bs + (slots % bs)[:, None]).reshape(-1)
        is_decode = meta.seq_lens_this_time == 1
        decode_ids = np.nonzero(is_decode)[0]
        prefills = [self._prefill_item(meta, i) for i in np.nonzero(~is_decode)[0]]
        num_blocks = 0
        decode_mask = None
        decode_gather = np.zeros(0, np.int64)
        if len(decode_ids):
            kv_lens = meta.seq_lens_decoder[decode_ids] + 1  # [num_decode]
            num_blocks = int(-(-kv_lens.max() // bs))
            decode_gather = _gather_rows(meta.block_tables[decode_ids, :num_blocks], kvh)
            valid = np.arange(num_blocks * bs)[None, :] < kv_lens[:, None]
            mask = np.where(valid, 0.0, -np.inf).astype(np.float32)[:, None, None, :]
            # expanded to the score shape: Paddle's CPU broadcasting add is ~50x slower than same-shape
            mask = np.ascontiguousarray(np.broadcast_to(mask, (len(decode_ids), kvh, self.group, mask.shape[-1])))
            decode_mask = _as_paddle(mask)
        return AttentionMetadata(
            write_slots=write_slots,
            num_decode=len(decode_ids),
            decode_gather_rows=decode_gather,
            decode_mask=decode_mask,
            prefills=prefills,
            num_decode_blocks=num_blocks,
        )

    def _prefill_item(self, meta: ForwardMeta, i: int) -> PrefillItem:
        start, n = int(meta.seq_lens_decoder[i]), int(meta.seq_lens_this_time[i])
        kv_len = start + n
        num_blocks = -(-kv_len // self.block_size)
        query_pos = start + np.arange(n)[:, None]
        key_pos = np.arange(num_blocks * self.block_size)[None, :]
        mask = np.where(key_pos <= query_pos, 0.0, -np.inf).astype(np.float32)
        rows = _gather_rows(meta.block_tables[i, :num_blocks], self.num_kv_heads)
        return PrefillItem(int(meta.cu_seqlens_q[i]), n, rows, mask)

    def forward(
        self,
        q: paddle.Tensor,
        k: paddle.Tensor,
        v: paddle.Tensor,
        key_cache: np.ndarray,
        value_cache: np.ndarray,
        meta: AttentionMetadata,
    ) -> paddle.Tensor:
        # q: [num_tokens, heads, head_dim]; k, v: [num_tokens, kv_heads, head_dim] or
        # [num_tokens, kv_heads * head_dim], strided views allowed (read through DLPack, not copied)
        # key_cache, value_cache: [num_blocks * kv_heads, block_size, head_dim]
        # returns [num_tokens, heads * head_dim]
        n, kvh, dim = q.shape[0], self.num_kv_heads, self.head_dim
        slots = meta.write_slots.reshape(n, kvh)
        key_cache.reshape(-1, dim)[slots] = _as_numpy(k).reshape(n, kvh, dim)
        value_cache.reshape(-1, dim)[slots] = _as_numpy(v).reshape(n, kvh, dim)
        q = q * self.scale
        outputs = []
        if meta.num_decode:
            outputs.append(self._decode(q[: meta.num_decode], key_cache, value_cache, meta))
        for item in meta.prefills:
            q_item = q[item.token_start : item.token_start + item.num_tokens]
            outputs.append(self._prefill(q_item, key_cache, value_cache, item))
        return outputs[0] if len(outputs) == 1 else paddle.concat(outputs, axis=0)

    def _decode(self, q, key_cache, value_cache, meta: AttentionMetadata) -> paddle.Tensor:
        # q: [num_decode, heads, head_dim] -> [num_decode, heads * head_dim]
        n, kvh, dim = q.shape[0], self.num_kv_heads, self.head_dim
        length = meta.num_decode_blocks * self.block_size
        keys = _as_paddle(key_cache[meta.decode_gather_rows].reshape(n, kvh, length, dim))
        values = _as_paddle(value_cache[meta.decode_gather_rows].reshape(n, kvh, length, dim))
        q = q.reshape([n, kvh, self.group, dim])
        scores = paddle.matmul(q, keys, transpose_y=True) + meta.decode_mask  # [n, kvh, group, length]
        out = paddle.matmul(F.softmax(scores, axis=-1), values)  # [n, kvh, group, dim]
        return out.reshape([n, self.num_heads * dim])

    def _prefill(self, q, key_cache, value_cache, item: PrefillItem) -> paddle.Tensor:
        # q: [num_tokens, heads, head_dim] -> [num_tokens, heads * head_dim]
        kvh, dim, group = self.num_kv_heads, self.head_dim, self.group
        length = item.mask.shape[1]
        keys = _as_paddle(key_cache[item.gather_rows].reshape(kvh, length, dim))
        values = _as_paddle(value_cache[item.gather_rows].reshape(kvh, length, dim))
        pieces = []
        for start in range(0, item.num_tokens, PREFILL_QUERY_BLOCK):
            qb = q[start : start + PREFILL_QUERY_BLOCK]  # [t, heads, dim]
            t = qb.shape[0]
            qb = qb.transpose([1, 0, 2]).reshape([kvh, group * t, dim])
            scores = paddle.matmul(qb, keys, transpose_y=True).reshape([kvh, group, t, length])
            scores = scores + _as_paddle(item.mask[start : start + t])
            probs = F.softmax(scores, axis=-1).reshape([kvh, group * t, length])
            out = paddle.matmul(probs, values).reshape([self.num_heads, t, dim])
            pieces.append(out.transpose([1, 0, 2]).reshape([t, self.num_heads * dim]))
        return pieces[0] if len(pieces) == 1 else paddle.concat(pieces, axis=0)
