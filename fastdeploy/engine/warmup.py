"""The start-up warm-up of `LLM(use_warmup=1)` (FastDeploy's setting): one largest step through the engine.

The first steps of a fresh engine pay costs later steps do not: page faults on the activations' heap
and on the KV blocks (their memory is committed on first use), one-time kernel setup. `warm_up` pays
them before the first user request: `max_num_seqs` distinct prompts that together fill one step's
token budget (as far as the KV pool holds them) are prefilled in one step and decoded for one more,
through the same path as any request (input processor, scheduler, executor, output processor).

It leaves no trace a user could see: its requests are greedy and seeded, so they draw nothing from
the engine's generator (unseeded sampling after it gets the numbers it would get without it); their
blocks are freed when they finish and the prefix cache is emptied, so no later prompt hits their
KV; and the request-id counter is set back, so the first user request is "0" as without warm-up.
"""
from __future__ import annotations

import logging
import time

from fastdeploy.engine.pooling_params import PoolingParams
from fastdeploy.engine.sampling_params import SamplingParams

logger = logging.getLogger("fastdeploy")

FILLER = "The quick brown fox jumps over the lazy dog. "  # plain text: no special or placeholder tokens
GENERATED = 2  # a prefill step, then a decode step


def warmup_shape(max_num_seqs: int, max_num_batched_tokens: int, max_model_len: int, num_blocks: int,
                 block_size: int) -> tuple[int, int]:
    """(prompts, tokens per prompt) of the warm-up: as many prompts as decode together, whose tokens
    fill one step's budget, each fitting max_model_len with GENERATED tokens and its share of the
    pool's usable blocks (block 0 is the null block)."""
    usable = num_blocks - 1
    prompts = min(max_num_seqs, usable)
    room = (usable // prompts) * block_size - GENERATED
    length = min(max_model_len - GENERATED, max_num_batched_tokens // prompts, room)
    return prompts, max(length, 1)


def warmup_prompts(tokenizer, prompts: int, length: int) -> list[list[int]]:
    """`prompts` token-id lists of `length` tokens, pairwise different in their first tokens (so no
    prompt reuses another's KV through the prefix cache)."""
    filler = tokenizer.encode(FILLER, add_special_tokens=False)
    body = filler * (length // len(filler) + 1)
    return [(tokenizer.encode(f"{i}. ", add_special_tokens=False) + body)[:length] for i in range(prompts)]


def warm_up(engine) -> None:
    """Run the warm-up on an idle LLMEngine (see the module docstring); returns when it is idle again."""
    if engine.has_unfinished_requests():
        raise RuntimeError("warm_up needs an idle engine: it would delay and share steps with queued requests")
    start = time.perf_counter()
    sc, cc = engine.config.scheduler_config, engine.config.cache_config
    prompts, length = warmup_shape(sc.max_num_seqs, sc.max_num_batched_tokens, sc.max_model_len,
                                   cc.num_blocks, cc.block_size)
    first_id = engine._next_id
    ids_list = warmup_prompts(engine.tokenizer, prompts, length)
    if engine.config.pooling_task is not None:  # a pooling model: the same prompts, pooled
        pooling = PoolingParams(task=engine.config.pooling_task)
        prepared = [engine.make_pooling_request(None, ids, pooling, i) for i, ids in enumerate(ids_list)]
    else:
        params = SamplingParams(temperature=0, seed=0, max_tokens=GENERATED, ignore_eos=True)
        prepared = [engine.make_request(None, ids, params, i) for i, ids in enumerate(ids_list)]
    for request in prepared:
        engine.enqueue(request)
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    engine.reset_prefix_cache()
    engine._next_id = first_id
    logger.info("warm-up: %d prompts x %d tokens, %d tokens generated each, %d steps in %.2f s", prompts,
                length, GENERATED, steps, time.perf_counter() - start)
