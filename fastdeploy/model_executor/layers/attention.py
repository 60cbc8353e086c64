"""Paged attention, pure-Paddle backend: the reference of the compiled `append_attention` op.

One call per layer: write this step's K/V into the paged cache by slot mapping, then attend each
request's new query tokens over everything its sequence has in the cache, causally. The input is
the fused projection `qkv [num_tokens, (heads + 2 kv_heads) * head_dim]` with RoPE applied.

The model chooses its backend once, at build (layers/append_attention.py: select_attention_backend):
the compiled op's backend when the op is built and the shapes suit it, else this one. Both have
the same two calls: `init_attention_metadata(forward_meta)` once per step, `forward(qkv, cache,
attn_metadata)` once per layer; tests run both against each other.

The KV cache is stored as layers/kv_cache.py lays it out (`KVCache`, one per layer): this backend
uses its numpy row view `[num_blocks * kv_heads, block_size, head_dim]`, where one (block, kv head)
pair is one contiguous row, so gathering a sequence's history is a single row gather whose result
is already `[kv_heads, blocks * block_size, head_dim]`. The gathers and cache writes run in numpy
(shared with Paddle through DLPack, no copies) because Paddle's CPU gather moves ~2.5 GB/s, a
fifth of numpy's; the arithmetic runs in Paddle. Over a bf16 cache (uint16 bits) writes round
float32 K/V to nearest even; reads widen exactly to float32 (the bits shifted up 16), and all
arithmetic stays float32.

Pure-Paddle path: requests are attended in groups, padded to the group's longest query and
history, with one batched matmul per group: the model runner orders the batch by query length
(decodes first), and consecutive requests share a group while padding at most doubles their
query rows. A request with more than `MAX_BATCHED_QUERY` query tokens (a long prompt) is attended
alone, in query blocks of `MAX_BATCHED_QUERY` rows to bound the score matrix. Decode never goes through
`scaled_dot_product_attention` (its CPU kernel is 3x slower at query length 1).
"""
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import paddle
import paddle.nn.functional as F

from fastdeploy.cache_manager.block_pool import NULL_BLOCK_ID
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.host_arrays import as_paddle
# KV-cache storage lives in kv_cache.py; these names stay importable from here
from fastdeploy.model_executor.layers.kv_cache import (  # noqa: F401
    KV_CACHE_BYTES, KV_CACHE_DTYPES, KVCache, allocate_kv_cache)
from fastdeploy.model_executor.layers.quantization.packed import bf16_bits
from fastdeploy.model_executor.ops import compiled_op

MAX_BATCHED_QUERY = 256


def compiled_append_attention(head_dim: int, block_size: int) -> Optional[Callable]:
    """The compiled `append_attention` op, or None when not built, fallbacks are forced, or the op's
    shape limits are not met (head_dim a multiple of 16, block_size a multiple of 4)."""
    if head_dim % 16 or block_size % 4:
        return None
    return compiled_op("append_attention")


def _as_paddle(array: np.ndarray) -> paddle.Tensor:
    return as_paddle(array)


def _as_numpy(tensor: paddle.Tensor) -> np.ndarray:
    return np.from_dlpack(tensor)


@dataclass
class AttentionGroup:
    """Requests attended together: rows token_start .. token_start + num_tokens of the batch."""

    token_start: int
    num_tokens: int
    num_requests: int
    max_query: int
    gather_rows: Optional[np.ndarray] = None  # [num_requests * kv_heads * num_blocks] cache rows
    mask: Optional[np.ndarray] = None  # [num_requests, kv_heads, group, max_query, length] 0 / -inf
    # Row permutations between the batch layout [tokens * heads] and the grouped layout
    # [num_requests * kv_heads * group * max_query] (queries padded by repeating the last one);
    # None when they coincide (max_query 1).
    to_grouped: Optional[np.ndarray] = None
    from_grouped: Optional[np.ndarray] = None


@dataclass
class AttentionMetadata:
    """Per-step metadata of the pure-Paddle path."""

    write_slots: np.ndarray  # [num_tokens, kv_heads] row of each new (token, kv head) in the flat cache
    groups: list  # AttentionGroup for short queries, LongPrefill for long ones, in batch order


@dataclass
class LongPrefill:
    token_start: int
    num_tokens: int
    history: int  # tokens of this request already in the cache before this step
    gather_rows: np.ndarray  # [kv_heads * num_blocks]
    mask: np.ndarray  # [num_tokens, num_blocks * block_size] additive causal mask
    to_grouped: np.ndarray  # [kv_heads * group * num_tokens]: for each grouped row, its batch row
    from_grouped: np.ndarray  # [num_tokens * heads]: for each (token, head), its grouped row


def _to_cache(rows: np.ndarray, cache: np.ndarray) -> np.ndarray:
    """float32 K or V rows in the cache's element type (bf16: rounded to nearest even)."""
    return bf16_bits(rows) if cache.dtype == np.uint16 else rows


def _widen(rows: np.ndarray) -> np.ndarray:
    """Rows gathered from a cache as float32 (bf16 bits widened exactly; float32 rows as they are)."""
    if rows.dtype != np.uint16:
        return rows
    wide = rows.astype(np.uint32)
    wide <<= 16
    return wide.view(np.float32)


def _gather_rows(block_table: np.ndarray, kv_heads: int) -> np.ndarray:
    """Cache rows for blocks [..., nb] -> [..., kv_heads, nb] flattened; -1 padding -> null block."""
    blocks = np.where(block_table < 0, NULL_BLOCK_ID, block_table)
    heads = np.arange(kv_heads, dtype=np.int64)
    return (blocks[..., None, :] * kv_heads + heads[:, None]).reshape(-1)


def _causal_mask(history: np.ndarray, queries: np.ndarray, max_query: int, length: int) -> np.ndarray:
    """[n, max_query, length] additive mask: query i of request r sees keys 0 .. history[r] + i."""
    query_pos = history[:, None] + np.arange(max_query)[None, :]  # [n, max_query]
    visible = np.arange(length)[None, None, :] <= query_pos[:, :, None]
    return np.where(visible, 0.0, -np.inf).astype(np.float32)


def _group_permutations(offsets: np.ndarray, query_lens: np.ndarray, kv_heads: int, group: int):
    """(to_grouped, from_grouped) row indices; see AttentionGroup. offsets: first token of each request."""
    n, max_query, heads = len(offsets), int(query_lens.max()), kv_heads * group
    slot = np.minimum(np.arange(max_query)[None, :], query_lens[:, None] - 1)  # [n, t]
    token = offsets[:, None] + slot  # [n, t], padding repeats the last query
    head = np.arange(heads).reshape(kv_heads, group)
    to_grouped = token[:, None, None, :] * heads + head[None, :, :, None]  # [n, kvh, group, t]
    position = np.arange(n * heads * max_query).reshape(n, kv_heads, group, max_query)
    real = np.arange(max_query)[None, :] < query_lens[:, None]  # [n, t]
    from_grouped = position.transpose(0, 3, 1, 2)[real]  # [num_tokens, kvh, group] in token order
    return to_grouped.reshape(-1), from_grouped.reshape(-1)


def _permute_rows(x: paddle.Tensor, index: np.ndarray, shape: list) -> paddle.Tensor:
    """Rows of x (contiguous, viewed as [-1, last dim]) taken in `index` order, reshaped."""
    rows = _as_numpy(x)
    return _as_paddle(np.take(rows.reshape(-1, rows.shape[-1]), index, axis=0).reshape(shape))


def split_into_groups(query_lens: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) request ranges: consecutive requests whose padded query rows stay <= 2x real."""
    groups, start = [], 0
    while start < len(query_lens):
        if query_lens[start] > MAX_BATCHED_QUERY:
            groups.append((start, start + 1))
            start += 1
            continue
        end, longest, total = start + 1, query_lens[start], query_lens[start]
        while end < len(query_lens) and query_lens[end] <= MAX_BATCHED_QUERY:
            new_longest, new_total = max(longest, query_lens[end]), total + query_lens[end]
            if new_longest * (end + 1 - start) > 2 * new_total:
                break
            end, longest, total = end + 1, new_longest, new_total
        groups.append((start, end))
        start = end
    return groups


class PaddleAttentionBackend:
    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                 scale: Optional[float] = None):
        """scale: multiplies q.k before the softmax; head_dim ** -0.5 when None."""
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.group = num_heads // num_kv_heads
        self.scale = head_dim**-0.5 if scale is None else scale

    # ---- per step ----------------------------------------------------------------------------
    def init_attention_metadata(self, meta: ForwardMeta) -> AttentionMetadata:
        """The step's indices and masks, shared by every layer (uses meta's numpy arrays only)."""
        kvh, bs = self.num_kv_heads, self.block_size
        slots = meta.slot_mapping
        rows = (slots // bs)[:, None] * kvh + np.arange(kvh)[None, :]  # [num_tokens, kv_heads]
        groups = []
        for start, end in split_into_groups(meta.seq_lens_this_time):
            if end - start == 1 and meta.seq_lens_this_time[start] > MAX_BATCHED_QUERY:
                groups.append(self._long_prefill(meta, start))
            else:
                groups.append(self._group(meta, start, end))
        return AttentionMetadata(write_slots=rows * bs + (slots % bs)[:, None], groups=groups)

    def _group(self, meta: ForwardMeta, start: int, end: int) -> AttentionGroup:
        query_lens = meta.seq_lens_this_time[start:end]
        history = meta.seq_lens_decoder[start:end]
        n, max_query = end - start, int(query_lens.max())
        num_blocks = int(-(-(history + query_lens).max() // self.block_size))
        group = AttentionGroup(int(meta.cu_seqlens_q[start]), int(query_lens.sum()), n, max_query)
        length = num_blocks * self.block_size
        mask = _causal_mask(history, query_lens, max_query, length)
        # expanded to the score shape: Paddle's CPU broadcasting add is ~50x slower than same-shape
        group.mask = np.ascontiguousarray(
            np.broadcast_to(mask[:, None, None], (n, self.num_kv_heads, self.group, max_query, length))
        )
        group.gather_rows = _gather_rows(meta.block_tables[start:end, :num_blocks], self.num_kv_heads)
        if max_query > 1:
            offsets = meta.cu_seqlens_q[start:end] - group.token_start
            group.to_grouped, group.from_grouped = _group_permutations(
                offsets, query_lens, self.num_kv_heads, self.group
            )
        return group

    def _long_prefill(self, meta: ForwardMeta, i: int) -> LongPrefill:
        history, n = meta.seq_lens_decoder[i : i + 1], int(meta.seq_lens_this_time[i])
        num_blocks = int(-(-(history[0] + n) // self.block_size))
        mask = _causal_mask(history, np.array([n]), n, num_blocks * self.block_size)[0]
        rows = _gather_rows(meta.block_tables[i, :num_blocks], self.num_kv_heads)
        to_grouped, from_grouped = _group_permutations(np.zeros(1, np.int64), np.array([n]), self.num_kv_heads,
                                                       self.group)
        return LongPrefill(int(meta.cu_seqlens_q[i]), n, int(history[0]), rows, mask, to_grouped, from_grouped)

    # ---- per layer ---------------------------------------------------------------------------
    def forward(self, qkv: paddle.Tensor, cache: KVCache, meta: AttentionMetadata) -> paddle.Tensor:
        """Write this step's K/V into `cache`, then attend; meta: this step's init_attention_metadata.

        qkv: [num_tokens, (heads + 2 kv_heads) * head_dim] contiguous, RoPE applied to q and k.
        Returns [num_tokens, heads * head_dim].
        """
        n, heads, kvh, dim = qkv.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        rows = _as_numpy(qkv)  # [n, (heads + 2 kvh) * dim]
        k, v = rows[:, heads * dim : (heads + kvh) * dim], rows[:, (heads + kvh) * dim :]
        cache.key.reshape(-1, dim)[meta.write_slots] = _to_cache(k.reshape(n, kvh, dim), cache.key)
        cache.value.reshape(-1, dim)[meta.write_slots] = _to_cache(v.reshape(n, kvh, dim), cache.value)
        # paddle.scale: 4x faster than `q * scale` on a strided view
        q = paddle.scale(qkv[:, : heads * dim], self.scale).reshape([n, heads, dim])
        outputs = []
        for g in meta.groups:
            q_part = q[g.token_start : g.token_start + g.num_tokens]
            attend = self._long_prefill_attention if isinstance(g, LongPrefill) else self._group_attention
            outputs.append(attend(q_part, cache, g))
        return outputs[0] if len(outputs) == 1 else paddle.concat(outputs, axis=0)

    def _history(self, cache: np.ndarray, rows: np.ndarray, shape: list) -> paddle.Tensor:
        return _as_paddle(_widen(cache[rows]).reshape(shape))

    def _group_attention(self, q, cache: KVCache, g: AttentionGroup) -> paddle.Tensor:
        # q: [num_tokens, heads, head_dim] (already scaled) -> [num_tokens, heads * head_dim]
        n, t, kvh, group, dim = g.num_requests, g.max_query, self.num_kv_heads, self.group, self.head_dim
        length = g.mask.shape[-1]
        keys = self._history(cache.key, g.gather_rows, [n, kvh, length, dim])
        values = self._history(cache.value, g.gather_rows, [n, kvh, length, dim])
        if g.to_grouped is None:
            q = q.reshape([n, kvh, group, dim])
        else:  # one row permutation pads and regroups; Paddle's 5-D transpose is ~50x slower
            q = _permute_rows(q, g.to_grouped, [n, kvh, group * t, dim])
        scores = paddle.matmul(q, keys, transpose_y=True).reshape([n, kvh, group, t, length])
        probs = F.softmax(scores + _as_paddle(g.mask), axis=-1).reshape([n, kvh, group * t, length])
        out = paddle.matmul(probs, values)  # [n, kvh, group * t, dim]
        if g.from_grouped is None:
            return out.reshape([n, self.num_heads * dim])
        return _permute_rows(out, g.from_grouped, [g.num_tokens, self.num_heads * dim])

    def _long_prefill_attention(self, q, cache: KVCache, item: LongPrefill) -> paddle.Tensor:
        # q: [num_tokens, heads, head_dim] -> [num_tokens, heads * head_dim]
        kvh, dim, group, t_all = self.num_kv_heads, self.head_dim, self.group, item.num_tokens
        length = item.mask.shape[1]
        keys = self._history(cache.key, item.gather_rows, [kvh, length, dim])
        values = self._history(cache.value, item.gather_rows, [kvh, length, dim])
        q = _permute_rows(q, item.to_grouped, [kvh, group, t_all, dim])
        pieces = []
        for start in range(0, t_all, MAX_BATCHED_QUERY):
            t = min(MAX_BATCHED_QUERY, t_all - start)
            visible = item.history + start + t  # causal: later keys are masked anyway, skip them
            qb = q[:, :, start : start + t].reshape([kvh, group * t, dim])
            scores = paddle.matmul(qb, keys[:, :visible], transpose_y=True).reshape([kvh, group, t, visible])
            probs = F.softmax(scores + _as_paddle(item.mask[start : start + t, :visible]), axis=-1)
            pieces.append(paddle.matmul(probs.reshape([kvh, group * t, visible]), values[:, :visible])
                          .reshape([kvh, group, t, dim]))
        out = pieces[0] if len(pieces) == 1 else paddle.concat(pieces, axis=2)  # [kvh, group, t_all, dim]
        return _permute_rows(out, item.from_grouped, [t_all, self.num_heads * dim])
