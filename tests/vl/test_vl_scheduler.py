"""The scheduler with images in prompts: prefix-cache keys carry each overlapping item's hash (same text
and a different image: no hit on the image's blocks; the same image: a hit), and no chunk of a chunked
prefill ends inside an item's placeholder tokens (random workloads, every step checked)."""
import random

import numpy as np
import pytest

from fastdeploy.cache_manager.block_pool import BlockPool
from fastdeploy.cache_manager.kv_cache_manager import KVCacheManager
from fastdeploy.engine.request import Request
from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.engine.sched.scheduler import Scheduler, whole_items_chunk
from fastdeploy.multimodal.inputs import MultiModalFeature
from vl_fakes import apply_step

PLACEHOLDER = 5
BS = 4


def feature(offset, length, mm_hash, modality="image"):
    return MultiModalFeature(modality, offset, length, np.zeros((length * 4, 588), np.float32), (1, 2, 2 * length),
                             mm_hash)


def mm_request(rid, text_before, length, text_after, mm_hash, max_tokens=1):
    ids = list(text_before) + [PLACEHOLDER] * length + list(text_after)
    return Request(request_id=rid, prompt_token_ids=ids, sampling_params=SamplingParams(max_tokens=max_tokens),
                   positions=np.zeros((3, len(ids)), np.int64), mm_features=[feature(len(text_before), length, mm_hash)])


def run_to_end(sched, requests):
    for r in requests:
        sched.add_request(r)
    steps = []
    while sched.has_unfinished():
        out = sched.schedule()
        steps.append(dict(out.num_scheduled_tokens))
        apply_step(sched, out)
    return steps


def test_different_image_same_text_misses_the_image_blocks_but_shares_the_text_before():
    sched = Scheduler(KVCacheManager(BlockPool(64), BS, enable_caching=True), 4, 256, False)
    text = list(range(100, 108))  # two whole blocks before the image
    run_to_end(sched, [mm_request("a", text, 8, [1, 2, 3, 4, 9], "hash-a")])
    b = mm_request("b", text, 8, [1, 2, 3, 4, 9], "hash-b")
    run_to_end(sched, [b])
    assert b.num_cached_tokens == 8  # the text blocks only
    c = mm_request("c", text, 8, [1, 2, 3, 4, 9], "hash-a")
    run_to_end(sched, [c])
    assert c.num_cached_tokens == 20  # every whole block: text, image, text after it (the last token is computed)


def test_block_key_names_only_items_overlapping_it():
    from fastdeploy.cache_manager.kv_cache_manager import block_extra_keys

    r = mm_request("r", [1, 2, 3], 6, [4, 5, 6, 7], "h")  # image at tokens 3..8
    assert [block_extra_keys(r, i, BS) for i in range(4)] == [("h",), ("h",), ("h",), ()]


@pytest.mark.parametrize("start,num_new,limit,expected", [
    (0, 10, 100, 3),     # ends inside an item that starts at 3: stop before it
    (3, 4, 100, 8),      # starts at the item: take it whole (8 tokens) though 4 were offered
    (3, 4, 6, 0),        # ...unless the budget is smaller than the item: wait
    (5, 2, 100, 6),      # starts inside (a prefix-cache hit mid-item): to the item's end
    (0, 3, 100, 3),      # ends right at the item's start
    (0, 11, 100, 11),    # ends right at its end
    (11, 5, 100, 5),     # after it
])
def test_whole_items_chunk(start, num_new, limit, expected):
    assert whole_items_chunk([feature(3, 8, "h")], start, num_new, limit) == expected


@pytest.mark.parametrize("seed", range(6))
def test_chunked_prefill_never_splits_an_item(seed):
    rng = random.Random(seed)
    budget = rng.choice([8, 12, 16, 32])
    sched = Scheduler(KVCacheManager(BlockPool(200), BS, enable_caching=rng.random() < 0.5), 4, budget, True,
                      long_prefill_token_threshold=rng.choice([0, 3, 5]))
    requests = []
    for i in range(8):
        length = rng.randint(1, budget)
        before = [rng.randrange(100, 200) for _ in range(rng.randint(0, 12))]
        after = [rng.randrange(100, 200) for _ in range(rng.randint(1, 9))]
        requests.append(mm_request(f"r{i}", before, length, after, f"h{rng.randrange(3)}", rng.randint(1, 4)))
    computed = {r.request_id: 0 for r in requests}
    by_id = {r.request_id: r for r in requests}
    for r in requests:
        sched.add_request(r)
    for _ in range(500):
        if not sched.has_unfinished():
            break
        out = sched.schedule()
        for new in out.scheduled_new_reqs:
            computed[new.req_id] = new.num_computed_tokens
        for rid, n in out.num_scheduled_tokens.items():
            f = by_id[rid].mm_features[0]
            start, end = computed[rid], computed[rid] + n
            assert not (f.offset < end < f.offset + f.length), f"seed {seed}: {rid} chunk [{start}, {end}) splits {f}"
            assert not (f.offset < start < f.offset + f.length) or by_id[rid].num_cached_tokens == start
            computed[rid] = end
        apply_step(sched, out)
    assert not sched.has_unfinished(), f"seed {seed}: not finished in 500 steps"
