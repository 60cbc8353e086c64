"""A step that fails (an exception or Ctrl-C inside the model) is undone by `Scheduler.rollback`:
prefix-cache blocks registered for KV that was never written are forgotten, requests admitted in
the step go back to the queue, and the runner gets every request of the step again in full."""
import pytest

from fastdeploy import SamplingParams
from fastdeploy.cache_manager.block_pool import BlockPool
from fastdeploy.cache_manager.kv_cache_manager import KVCacheManager
from fastdeploy.engine.request import RequestStatus
from fastdeploy.engine.sched.scheduler import Scheduler

from fake_model import apply_step, text_request

BLOCK = 4


def make_scheduler(num_blocks=40):
    pool = BlockPool(num_blocks)
    return pool, Scheduler(KVCacheManager(pool, BLOCK, enable_caching=True), max_num_seqs=8,
                           max_num_batched_tokens=64, enable_chunked_prefill=False)


def test_rollback_forgets_blocks_registered_by_the_failed_step_and_requeues_admissions():
    pool, sched = make_scheduler()
    shared = list(range(100, 112))  # three full blocks
    a = text_request("a", shared + [1, 2], 3)
    b = text_request("b", shared + [3], 3)
    sched.add_request(a)
    sched.add_request(b)
    first = sched.schedule()
    assert pool.num_cached_blocks == 3 and pool.ref_counts[a.block_ids[0]] == 2  # b shares a's blocks
    sched.rollback()
    assert pool.num_cached_blocks == 0, "blocks holding no KV stayed in the prefix cache"
    assert pool.num_free_blocks == pool.num_usable_blocks
    assert list(sched.waiting) == [a, b] and not sched.running
    for r in (a, b):
        assert r.status == RequestStatus.WAITING and r.num_computed_tokens == 0 and r.block_ids == []
        assert r.num_preemptions == 0 and r.num_cached_tokens is None and r.block_hashes == []
    again = sched.schedule()  # the same step again, each request sent to the runner in full
    assert again.num_scheduled_tokens == first.num_scheduled_tokens
    assert [n.req_id for n in again.scheduled_new_reqs] == ["a", "b"] and not again.scheduled_cached_reqs


def test_rollback_of_a_decode_step_keeps_earlier_blocks_and_resends_state():
    pool, sched = make_scheduler()
    a = text_request("a", list(range(7)), 5)
    sched.add_request(a)
    apply_step(sched, sched.schedule(), lambda r: 50)  # prefill: 7 tokens computed, token 50 sampled
    cached_before = pool.num_cached_blocks  # one full block of the prompt
    blocks_before = list(a.block_ids)
    out = sched.schedule()  # decode of token 8: completes block 2, registered in this step
    assert pool.num_cached_blocks == cached_before + 1 and out.scheduled_cached_reqs
    sched.rollback()
    assert pool.num_cached_blocks == cached_before
    assert a.block_ids == blocks_before and a.num_computed_tokens == 7 and a in sched.running
    retry = sched.schedule()
    assert [n.req_id for n in retry.scheduled_new_reqs] == ["a"]  # full state again, not a diff
    assert retry.scheduled_new_reqs[0].block_ids == a.block_ids and retry.num_scheduled_tokens == {"a": 1}


def test_rollback_frees_the_blocks_the_failed_step_gave_a_running_request():
    pool = BlockPool(6)
    sched = Scheduler(KVCacheManager(pool, 1, enable_caching=False), max_num_seqs=2, max_num_batched_tokens=2,
                      enable_chunked_prefill=True, long_prefill_token_threshold=1)
    r = text_request("r", [5, 6, 7], 1)
    sched.add_request(r)
    apply_step(sched, sched.schedule(), lambda request: 0)  # its first prompt chunk is computed
    held = list(r.block_ids)
    sched.schedule()  # gives it blocks for its next chunk; the step then fails
    assert len(r.block_ids) > len(held)
    sched.rollback()
    assert r.block_ids == held and r.num_computed_tokens == len(held)
    assert pool.num_free_blocks == pool.num_usable_blocks - len(held)


def test_finished_ids_are_sent_again_after_a_failed_step():
    _, sched = make_scheduler()
    a, b = text_request("a", [1, 2, 3], 4), text_request("b", [4, 5, 6], 4)
    sched.add_request(a)
    sched.add_request(b)
    apply_step(sched, sched.schedule(), lambda r: 9)
    sched.finish_requests(["a"])  # e.g. a stop string
    assert sched.schedule().finished_req_ids == {"a"}
    sched.rollback()
    assert sched.schedule().finished_req_ids == {"a"}  # the failed step may never have told the runner


def test_failed_step_in_the_engine_leaves_no_prefix_cache_hit_on_unwritten_kv(smollm_llm, monkeypatch):
    """Ctrl-C inside the model during a prefill: the next identical prompt must not hit the blocks
    that step registered (their KV was never written) and must give the tokens of a clean run."""
    llm = smollm_llm
    engine = llm.llm_engine
    prompt = {"prompt_token_ids": [(37 * i + 11) % 40000 + 100 for i in range(200)]}  # 3 full blocks of 64
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm.reset_prefix_cache()

    def interrupted(scheduler_output):
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.executor, "execute_model", interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompt, params, use_tqdm=False)
    monkeypatch.undo()
    assert engine.block_pool.num_cached_blocks == 0
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_usable_blocks
    after = llm.generate(prompt, params, use_tqdm=False)[0]
    assert after.num_cached_tokens == 0
    llm.reset_prefix_cache()
    clean = llm.generate(prompt, params, use_tqdm=False)[0]
    assert after.outputs.token_ids == clean.outputs.token_ids
