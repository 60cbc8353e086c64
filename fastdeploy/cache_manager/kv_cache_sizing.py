"""How many KV blocks the pool gets: decided once, at engine start, before the model is built.

Inputs: the user's cache settings (`CacheConfig`: block_size, num_gpu_blocks_override,
gpu_memory_utilization), max_model_len and max_num_seqs, the model's shape (`ModelConfig`: layers,
KV heads, head_dim), the bytes of the weights as the resolved weight format holds them, and the
KV cache's dtype (its bytes per element: layers/kv_cache.py `KV_CACHE_BYTES`).

num_gpu_blocks_override, when given, is the pool's size (block 0, the null block, included). Else
the pool takes the memory left beside the weights, `gpu_memory_utilization` x available memory
(`MemAvailable` on Linux) - weights, in whole blocks, but no more than max_num_seqs full-length
sequences use. Settings that leave no room for one max_model_len sequence are a ValueError naming
the numbers and what to change.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Optional

from fastdeploy.config import CacheConfig, FDConfig, ModelConfig
from fastdeploy.model_executor.layers.kv_cache import KV_CACHE_BYTES
from fastdeploy.platforms.cpu import proc_bytes

logger = logging.getLogger("fastdeploy")

GiB = 1 << 30


def size_kv_cache(config: FDConfig, weights_bytes: int, dtype: str) -> CacheConfig:
    """`config.cache_config` with the pool sized: `num_blocks` (see num_kv_blocks) and the cache's
    `dtype` ("float32" or "bfloat16": WeightFormat.kv_cache_dtype). weights_bytes: the weights as held
    (ModelConfig.weight_bytes of the resolved format). ValueError as num_kv_blocks."""
    cc, sc = config.cache_config, config.scheduler_config
    spec = config.speculative_config
    draft = spec.draft if spec is not None else None
    extra = draft.model_config.kv_bytes_per_token(KV_CACHE_BYTES[draft.kv_cache_dtype]) if draft is not None else 0
    num_blocks = num_kv_blocks(cc, config.model_config, sc.max_model_len, sc.max_num_seqs, weights_bytes, dtype,
                               sc.max_num_batched_tokens if config.pooling_task is not None else None, extra)
    logger.info("total_block_num:%d (block_size %d, %d tokens, %s)", num_blocks, cc.block_size,
                (num_blocks - 1) * cc.block_size, dtype)
    return dataclasses.replace(cc, num_blocks=num_blocks, dtype=dtype)


def num_kv_blocks(cache: CacheConfig, model: ModelConfig, max_model_len: int, max_num_seqs: int,
                  weights_bytes: int, dtype: str, pooling_step_tokens: Optional[int] = None,
                  draft_bytes_per_token: int = 0) -> int:
    """Blocks in the pool, the null block included: `cache.num_gpu_blocks_override`, or as many blocks of
    `dtype` as the memory left beside `weights_bytes` holds, at most what max_num_seqs full sequences
    use, or for a pooling model (`pooling_step_tokens`: its token budget; its requests live one step) what
    one step's prompts use. `draft_bytes_per_token`: a draft model's K/V per token (speculative
    decoding), held in the same blocks. ValueError when the pool would not hold one max_model_len
    sequence."""
    blocks_per_seq = -(-max_model_len // cache.block_size)
    num_blocks = cache.num_gpu_blocks_override
    if num_blocks is not None:
        if num_blocks - 1 < blocks_per_seq:
            raise ValueError(
                f"num_gpu_blocks_override={num_blocks} leaves {num_blocks - 1} usable blocks (block 0 is the "
                f"null block), but one max_model_len={max_model_len} sequence needs {blocks_per_seq} "
                f"blocks of {cache.block_size} tokens: raise it to at least {blocks_per_seq + 1} or lower "
                "max_model_len"
            )
        return num_blocks
    block_bytes = (model.kv_bytes_per_token(KV_CACHE_BYTES[dtype]) + draft_bytes_per_token) * cache.block_size
    available = available_memory_bytes()
    budget = cache.gpu_memory_utilization * available - weights_bytes
    needed = (blocks_per_seq + 1) * block_bytes
    if budget < needed:
        raise ValueError(
            f"one max_model_len={max_model_len} sequence needs {needed / GiB:.2f} GiB of KV cache, "
            f"{max(budget, 0) / GiB:.2f} GiB is available ({cache.gpu_memory_utilization} x "
            f"{available / GiB:.2f} GiB free memory - {weights_bytes / GiB:.2f} GiB weights): lower "
            "max_model_len, or raise gpu_memory_utilization, or free memory"
        )
    useful = max_num_seqs * blocks_per_seq + 1
    if pooling_step_tokens is not None:  # each request may leave one block part-full
        useful = min(useful, -(-pooling_step_tokens // cache.block_size) + max_num_seqs + 1)
    if block_bytes == 0:  # an encoder: the blocks only count tokens, the runner allocates no cache
        return useful
    return int(min(budget // block_bytes, useful))


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else total physical memory."""
    available = proc_bytes("/proc/meminfo", "MemAvailable")
    return available if available is not None else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
