"""KV cache end to end on the default model (SmolLM2-135M), greedy: prefix caching, chunked prefill,
preemption and tiny pools change when tokens are computed, never which tokens come out.

Oracle: the same prompts on an LLM with prefix caching off, chunked prefill off and a big pool
(`llm_off`), with top-2 logprobs so a divergence is accepted only at a near-tie (top-2 logit gap
below helpers.NEAR_TIE, where float rounding may pick either token; see test_default_model_greedy.py).
Prefix caching on is the session `smollm_llm` (same block size), emptied with reset_prefix_cache().
`num_cached_tokens` is checked by arithmetic: whole blocks, at most (prompt_len - 1) // block_size.
Errors about sizing the pool: test_kv_pool_errors.py.
"""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.input.input_processor import InputProcessor
from fastdeploy.engine.sched.scheduler import Scheduler
from helpers import SMOLLM_BLOCK_SIZE, assert_engine_idle, assert_same_greedy, blocks_in_use, run, top2_gaps
from helpers import greedy as plain_greedy

BLOCK = SMOLLM_BLOCK_SIZE  # block size of the big-pool LLMs, the session smollm_llm's included
MAX_LEN = 512

SYSTEM = (
    "You are the support assistant of Harbor Lane Hardware, a small family-run hardware store. "
    "Always answer politely and briefly, in plain English, and never invent prices or stock levels. "
    "The store opens at eight in the morning and closes at six in the evening from Monday to Friday; "
    "on Saturday it opens at nine and closes at four, and on Sunday it is closed. "
    "Customers can return unused items within thirty days with a receipt; opened paint, cut keys, "
    "custom-mixed colors and lumber cut to size cannot be returned. "
    "The store sells hand tools, power tools, fasteners, plumbing parts, electrical supplies, paint, "
    "garden tools, seeds in spring, and snow shovels and ice melt in winter. "
    "Key cutting, screen repair, glass cutting and propane refills are done at the service desk. "
    "If a question is about safety, such as electrical wiring or gas lines, recommend a licensed "
    "professional. If you do not know an answer, say so and suggest calling the store. "
    "Delivery is available within ten miles for orders over fifty dollars, usually on the next business "
    "day; large items such as lumber, ladders and wheelbarrows are delivered on Tuesdays and Thursdays. "
    "Gift cards never expire and can be used together with any other discount, but not to buy other gift cards. "
    "Keep every answer under three sentences unless the customer asks for step-by-step instructions.\n"
)
QUESTIONS = [
    "Question: Are you open on Sunday?\nAnswer:",
    "Question: Can I return a can of paint I opened?\nAnswer:",
    "Question: Do you cut keys?\nAnswer:",
    "Question: What should I use to fix a leaking faucet?\nAnswer:",
    "Question: When do you sell seeds?\nAnswer:",
]
SHARED = [SYSTEM + q for q in QUESTIONS]
UNRELATED = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "List three primary colors:",
]


def random_ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1000, 40000) for _ in range(n)]


# token-id prompts for num_cached_tokens: exact multiples of BLOCK among them; distinct first tokens
CACHE_LENGTHS = [5, 16, 17, 48, 64, 70, 100]
CACHE_PROMPTS = [random_ids(1000 + n, n) for n in CACHE_LENGTHS]


def greedy(max_tokens: int, **kw) -> SamplingParams:
    """Greedy with top-2 logprobs: the near-tie tolerance of assert_same_greedy needs them."""
    return plain_greedy(max_tokens, logprobs=2, **kw)


def assert_outputs_match(outputs, references, what: str) -> None:
    assert len(outputs) == len(references)
    for i, (o, r) in enumerate(zip(outputs, references)):
        assert o.prompt_token_ids == r.prompt_token_ids
        assert_same_greedy(o.outputs.token_ids, r.outputs.token_ids, top2_gaps(r.outputs), f"{what} prompt {i}:")


# ---- the LLMs (each ~8 s to build) ----------------------------------------------------------------
@pytest.fixture(scope="module")
def llm_on(smollm_llm):
    """Prefix caching on (the default): the session LLM. Its first generate call here runs on a
    cache emptied by reset_prefix_cache()."""
    assert smollm_llm.reset_prefix_cache() is True
    fresh = run(smollm_llm, CACHE_PROMPTS, greedy(8))
    return SimpleNamespace(llm=smollm_llm, fresh=fresh)


def big_pool_llm(**scheduling) -> LLM:
    return LLM(max_model_len=MAX_LEN, block_size=BLOCK, max_num_seqs=16, **scheduling)


@pytest.fixture(scope="module")
def llm_off():
    return big_pool_llm(enable_prefix_caching=False)


@pytest.fixture(scope="module")
def llm_chunk16():
    return big_pool_llm(enable_chunked_prefill=True, max_num_batched_tokens=16)


@pytest.fixture(scope="module")
def llm_chunk64():
    return big_pool_llm(enable_chunked_prefill=True, max_num_batched_tokens=64)


SMALL_BLOCK, SMALL_LEN, SMALL_BLOCKS = 8, 160, 21  # 20 usable blocks = one max_model_len sequence


@pytest.fixture(scope="module")
def llm_small():
    return LLM(max_model_len=SMALL_LEN, block_size=SMALL_BLOCK, num_gpu_blocks_override=SMALL_BLOCKS)


@pytest.fixture(scope="module")
def reference(llm_off):
    """Greedy outputs (with top-2 logprobs) of llm_off, computed once per (prompts, params)."""
    memo = {}

    def get(prompts, params):
        key = (repr(prompts), repr(params))
        if key not in memo:
            memo[key] = run(llm_off, prompts, params)
        return memo[key]

    return get


def full_blocks(n: int, block_size: int = BLOCK) -> int:
    """num_cached_tokens of a repeated n-token prompt: whole blocks, one token left to compute."""
    return (n - 1) // block_size * block_size


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# ---- prefix caching on vs off ------------------------------------------------------------------------
def test_shared_system_prompt_same_tokens_with_and_without_prefix_caching(llm_on, reference):
    llm = llm_on.llm
    params = greedy(12)
    ref = reference(SHARED, params)
    lengths = [len(r.prompt_token_ids) for r in ref]
    assert min(lengths) > 250, "the shared prompts are meant to be a few hundred tokens"
    first = run(llm, SHARED, params)  # one batch: later prompts share blocks the first computes
    assert_outputs_match(first, ref, "prefix caching, first run")
    for i, o in enumerate(first):
        c = o.num_cached_tokens
        assert c % BLOCK == 0 and c <= full_blocks(lengths[i])
        if i > 0:  # at least the blocks it shares with the earlier prompts of the batch
            shared = max(common_prefix(o.prompt_token_ids, ref[j].prompt_token_ids) for j in range(i))
            assert c >= min(shared // BLOCK * BLOCK, full_blocks(lengths[i])) > 0
    again = run(llm, SHARED, params)
    assert_outputs_match(again, ref, "prefix caching, repeat")
    assert [o.num_cached_tokens for o in again] == [full_blocks(n) for n in lengths]
    assert_engine_idle(llm)


def test_unrelated_prompts_same_tokens_with_and_without_prefix_caching(llm_on, reference):
    params = greedy(16)
    ref = reference(UNRELATED, params)
    for attempt in range(2):
        assert_outputs_match(run(llm_on.llm, UNRELATED, params), ref, f"unrelated, run {attempt}")
    assert_engine_idle(llm_on.llm)


def test_num_cached_tokens_miss_then_hit_then_reset(llm_on, reference):
    llm, fresh = llm_on.llm, llm_on.fresh
    assert [o.num_cached_tokens for o in fresh] == [0] * len(CACHE_PROMPTS), "fresh LLM: nothing cached"
    assert_outputs_match(fresh, reference(CACHE_PROMPTS, greedy(8)), "fresh run")
    hit = run(llm, CACHE_PROMPTS, greedy(8))
    assert [o.num_cached_tokens for o in hit] == [full_blocks(n) for n in CACHE_LENGTHS]
    assert [full_blocks(n) for n in CACHE_LENGTHS] == [0, 0, 16, 32, 48, 64, 96]  # the arithmetic
    assert_outputs_match(hit, fresh, "hit vs miss")
    assert llm.reset_prefix_cache() is True
    after_reset = run(llm, CACHE_PROMPTS, greedy(8))
    assert [o.num_cached_tokens for o in after_reset] == [0] * len(CACHE_PROMPTS)
    assert_outputs_match(after_reset, fresh, "after reset vs miss")
    assert_engine_idle(llm)


def test_prefix_caching_off_reports_no_cached_tokens(llm_off):
    out = run(llm_off, CACHE_PROMPTS[3:5] * 2, greedy(2))
    assert [o.num_cached_tokens for o in out] == [0] * 4


# ---- chunked prefill ---------------------------------------------------------------------------------
@pytest.mark.parametrize("budget", [16, 64])
def test_chunked_prefill_gives_the_same_tokens_as_unchunked(request, budget, reference, monkeypatch):
    """Budgets 16 and 64 (below max_model_len=512, allowed with chunked prefill) against the
    reference, which runs unchunked (budget max(8192, max_model_len): each prompt in one step)."""
    llm = request.getfixturevalue(f"llm_chunk{budget}")
    step_tokens = []
    original = Scheduler.schedule

    def recording(self):
        out = original(self)
        if self is llm.llm_engine.scheduler:  # not the reference LLM's steps
            step_tokens.append(out.total_num_scheduled_tokens)
        return out

    monkeypatch.setattr(Scheduler, "schedule", recording)
    prompts = SHARED[:3] + UNRELATED[:2]
    params = greedy(10)
    out = run(llm, prompts, params)
    assert_outputs_match(out, reference(prompts, params), f"chunked prefill, budget {budget}")
    assert max(step_tokens) == budget  # prompts were cut into budget-sized steps
    assert sum(len(o.prompt_token_ids) for o in out) > 2 * budget
    assert_engine_idle(llm)


# ---- preemption ---------------------------------------------------------------------------------------
def test_tiny_pool_preempts_often_and_gives_the_same_tokens(llm_small, reference, preemptions):
    pool = llm_small.llm_engine.block_pool
    assert pool.num_usable_blocks == SMALL_LEN // SMALL_BLOCK  # exactly one max_model_len sequence
    # 24 prompts of 3..7 tokens: 20 are admitted with one block each, filling the pool; each then
    # needs 2 more blocks for its 16 tokens, so requests keep preempting each other
    prompts = [random_ids(2000 + i, 3 + i % 5) for i in range(24)]
    params = greedy(16, ignore_eos=True)
    out = run(llm_small, prompts, params)
    assert preemptions[0] >= 10, f"only {preemptions[0]} preemptions: the pool was meant to be far too small"
    assert_outputs_match(out, reference(prompts, params), "tiny pool")
    assert all(len(o.outputs.token_ids) == 16 for o in out)
    assert_engine_idle(llm_small)


def test_thousand_short_requests_through_twenty_blocks(llm_small, reference):
    rng = random.Random(7)
    n = 1000
    prompts = [[rng.randrange(1000, 40000) for _ in range(rng.randint(1, 5))] for _ in range(n)]
    params = [SamplingParams(temperature=0, max_tokens=rng.randint(1, 3)) for _ in range(n)]
    out = run(llm_small, prompts, params)
    assert len(out) == n and all(o is not None for o in out)
    assert len({o.request_id for o in out}) == n
    eos = llm_small.get_tokenizer().eos_token_id
    for i, o in enumerate(out):
        assert o.prompt_token_ids == prompts[i], f"output {i} belongs to another prompt"
        c = o.outputs
        assert 1 <= len(c.token_ids) <= params[i].max_tokens
        if c.finish_reason == "length":
            assert len(c.token_ids) == params[i].max_tokens
        else:
            assert c.finish_reason == "stop" and c.token_ids[-1] == eos, (i, c.finish_reason, c.token_ids)
    # a sample of them against the oracle (one batch there): each output is its own prompt's
    sample = sorted(rng.sample(range(n), 24))
    refs = reference([prompts[i] for i in sample], [greedy(params[i].max_tokens) for i in sample])
    for i, ref in zip(sample, refs):
        assert_same_greedy(out[i].outputs.token_ids, ref.outputs.token_ids, top2_gaps(ref.outputs), f"request {i}:")
    assert_engine_idle(llm_small)


# ---- abort ----------------------------------------------------------------------------------------------
def test_abort_frees_every_block_including_shared_cached_ones(llm_on, reference):
    llm = llm_on.llm
    engine = llm.llm_engine
    pool = engine.block_pool
    tokenizer = llm.get_tokenizer()
    prompts = [tokenizer.encode(SYSTEM + "Question: Do you sell ladders?\nAnswer:" + " " * i, add_special_tokens=False)
               for i in range(3)]
    ids = [engine.add_request(None, p, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True))
           for p in prompts]
    engine.step()
    engine.step()
    assert max(pool.ref_counts) >= 3, "the three requests were meant to share the system prompt's blocks"
    assert blocks_in_use(llm) > 0
    outputs = [engine.abort_request(i) for i in ids]
    assert all(o.outputs.finish_reason == "abort" for o in outputs)
    assert_engine_idle(llm)
    assert engine.abort_request(ids[0]) is None  # unknown now
    # the aborted requests' blocks stay cached and serve a later request correctly
    out = run(llm, [prompts[0]], greedy(8))
    assert out[0].num_cached_tokens == full_blocks(len(prompts[0]))
    assert_outputs_match(out, reference([prompts[0]], greedy(8)), "after abort")
    assert_engine_idle(llm)


def test_abort_mid_chunked_prefill_keeps_only_computed_blocks(llm_chunk16, reference):
    engine = llm_chunk16.llm_engine
    prompt = random_ids(3000, 120)
    request_id = engine.add_request(None, prompt, SamplingParams(temperature=0, max_tokens=4))
    for _ in range(3):
        assert engine.step() == []  # 16 prompt tokens per step: nothing finishes
    out = engine.abort_request(request_id)
    assert out.outputs.finish_reason == "abort" and out.outputs.token_ids == []
    assert_engine_idle(llm_chunk16)
    # the 3 blocks computed before the abort are found again, and hold the right KV
    again = run(llm_chunk16, [prompt], greedy(8))
    assert again[0].num_cached_tokens == 3 * BLOCK
    assert_outputs_match(again, reference([prompt], greedy(8)), "after aborted prefill")
    assert_engine_idle(llm_chunk16)


# ---- prompts against the pool's size ------------------------------------------------------------------
def test_prompt_needing_more_blocks_than_the_pool(llm_small):
    """Through LLM() no prompt can need more blocks than the pool: the pool holds one
    max_model_len sequence, and a prompt is shorter. The longest prompt fills the whole pool and
    still generates; validate_prompt's own message is checked on a pool swapped for a smaller one."""
    engine = llm_small.llm_engine
    usable = engine.block_pool.num_usable_blocks
    assert -(-(SMALL_LEN - 1) // SMALL_BLOCK) <= usable
    out = run(llm_small, [random_ids(4000, SMALL_LEN - 1)], SamplingParams(temperature=0, max_tokens=5))
    assert len(out[0].outputs.token_ids) == 1  # room for one token only
    assert_engine_idle(llm_small)
    stub = SimpleNamespace(config=engine.config, num_usable_blocks=4)  # 4 usable blocks of 8 tokens
    with pytest.raises(ValueError) as e:
        InputProcessor.validate_prompt(stub, random_ids(5000, 33), index=3)
    message = str(e.value)
    for part in ("prompt (prompt 3)", "needs 5 KV blocks", "the pool has 4", "num_gpu_blocks_override"):
        assert part in message, f"{part!r} not in: {message}"
    InputProcessor.validate_prompt(stub, random_ids(5000, 32))  # 4 blocks: fits
