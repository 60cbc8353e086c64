"""Speculative decoding end to end on the default model: the tokens of non-speculative decoding
(greedy up to near-ties, seeded sampling), whatever the feature it meets."""
import pytest

from fastdeploy import LLM, SamplingParams
from helpers import SMOLLM_BLOCK_SIZE, SMOLLM_MAX_MODEL_LEN, assert_engine_idle, assert_same_greedy, top2_gaps
from prompts import PASSAGES, conversations

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "min_ngram_size": 2, "max_ngram_size": 4}
TOKENS = 48
PASSAGE = PASSAGES[0]


def make_llm(smollm_path, spec=NGRAM, **kwargs):
    kwargs.setdefault("max_num_seqs", 4)  # 4 decodes leave the step room for 12 draft rows
    kwargs.setdefault("max_model_len", SMOLLM_MAX_MODEL_LEN)
    return LLM(model=smollm_path, block_size=SMOLLM_BLOCK_SIZE, speculative_config=spec, **kwargs)


@pytest.fixture(scope="module")
def plain(smollm_path):
    llm = make_llm(smollm_path, spec=None)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def ngram(smollm_path):
    llm = make_llm(smollm_path)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def reference(plain):
    """The 32 conversations' greedy outputs without speculation, with top-2 logprobs (near-ties)."""
    return plain.chat(conversations(), SamplingParams(temperature=0, max_tokens=TOKENS, logprobs=2), use_tqdm=False)


def assert_same_as_reference(outs, reference, what):
    for i, (out, ref) in enumerate(zip(outs, reference)):
        assert_same_greedy(out.outputs.token_ids, ref.outputs.token_ids, top2_gaps(ref.outputs), f"{what} prompt {i}")


def test_greedy_tokens_equal_non_speculative(ngram, reference):
    outs = ngram.chat(conversations(), SamplingParams(temperature=0, max_tokens=TOKENS, logprobs=2), use_tqdm=False)
    assert_same_as_reference(outs, reference, "ngram")
    drafted = sum(o.metrics.num_draft_tokens for o in outs[:16])
    accepted = sum(o.metrics.num_accepted_tokens for o in outs[:16])
    assert accepted > 0.5 * drafted > 0  # the grounded prompts do copy their passages
    assert all(0 <= o.metrics.num_accepted_tokens <= o.metrics.num_draft_tokens for o in outs)
    # the logprobs of the emitted tokens are those of the non-speculative run (rows of one forward)
    for out, ref in zip(outs, reference):
        n = 0
        for ours, theirs in zip(out.outputs.logprobs, ref.outputs.logprobs):
            if list(ours) != list(theirs):
                break
            for token, entry in ours.items():
                assert entry.logprob == pytest.approx(theirs[token].logprob, abs=2e-3)
                assert entry.rank == theirs[token].rank
            n += 1
        assert n > 0
    assert_engine_idle(ngram)


def test_single_stream_and_batch_alone(ngram, reference):
    """One request at a time, as a single stream runs."""
    for i in (0, 5, 20):
        out = ngram.chat([conversations()[i]], SamplingParams(temperature=0, max_tokens=TOKENS), use_tqdm=False)[0]
        assert_same_greedy(out.outputs.token_ids, reference[i].outputs.token_ids, top2_gaps(reference[i].outputs))


def test_seeded_sampling_draws_the_same_tokens(ngram, plain):
    """A seeded request draws the uniform number of each position whichever step samples it, so
    speculation changes no token (up to near-ties of the sampled distribution's CDF: none expected
    in a few prompts)."""
    params = [SamplingParams(temperature=0.8, top_p=0.95, seed=s, max_tokens=TOKENS) for s in range(6)]
    convs = conversations()[:3] + conversations()[16:19]
    ours = ngram.chat(convs, params, use_tqdm=False)
    theirs = plain.chat(convs, params, use_tqdm=False)
    assert [o.outputs.token_ids for o in ours] == [o.outputs.token_ids for o in theirs]
    assert sum(o.metrics.num_accepted_tokens for o in ours) > 0


def test_stops_min_tokens_penalties_and_n(ngram, plain):
    convs = conversations()[:4]
    cases = [
        SamplingParams(temperature=0, max_tokens=TOKENS, stop=["fishing", "blue light", "beans", "price"]),
        SamplingParams(temperature=0, max_tokens=TOKENS, min_tokens=20, repetition_penalty=1.3),
        SamplingParams(temperature=0, max_tokens=TOKENS, frequency_penalty=0.5, presence_penalty=0.3),
        SamplingParams(temperature=0, max_tokens=7),  # max_tokens inside a run of accepted drafts
        SamplingParams(temperature=0.7, seed=3, n=3, max_tokens=TOKENS),
    ]
    tok = ngram.get_tokenizer()
    stop_ids = tok.encode(" town", add_special_tokens=False)[:1]
    cases.append(SamplingParams(temperature=0, max_tokens=TOKENS, stop_token_ids=stop_ids))
    for params in cases:
        ours = ngram.chat(convs, params, use_tqdm=False)
        theirs = plain.chat(convs, params, use_tqdm=False)
        for a, b in zip(ours, theirs):
            assert [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in a.outputs] == \
                   [(c.token_ids, c.text, c.finish_reason, c.stop_reason) for c in b.outputs], params
    assert_engine_idle(ngram)


def test_prefix_cache_chunked_prefill_and_preemption(smollm_path, reference, preemptions):
    """A small pool (preemptions), chunked prefill in small chunks, and the prefix cache shared by
    the conversations' common template, all at once."""
    llm = make_llm(smollm_path, enable_chunked_prefill=True, max_num_batched_tokens=64, max_model_len=320,
                   num_gpu_blocks_override=26, max_num_seqs=6)
    try:
        outs = llm.chat(conversations(), SamplingParams(temperature=0, max_tokens=TOKENS), use_tqdm=False)
        assert_same_as_reference(outs, reference, "small pool")
        assert preemptions[0] > 0
        assert sum(o.num_cached_tokens for o in outs) > 0
        assert_engine_idle(llm)
    finally:
        llm.shutdown()


def test_structured_outputs_mask_every_verified_row(ngram, plain):
    """Constrained requests verify drafts under a mask per row: JSON copied from the passage, a
    regex, a choice, beside a free request; the same tokens as without speculation."""
    import json

    from fastdeploy.engine.sampling_params import GuidedDecodingParams

    schema = {"type": "object", "properties": {"town": {"type": "string"}, "river": {"type": "string"},
                                               "boats": {"type": "integer"}},
              "required": ["town", "river", "boats"], "additionalProperties": False}
    question = [{"role": "user", "content": "Give the town, the river and the number of boats as JSON, copying "
                                            "the words from this text:\n\n" + PASSAGE}]
    cases = [
        (question, GuidedDecodingParams(json=schema)),
        (question, GuidedDecodingParams(regex=r"The town of [A-Z][a-z]+ has (forty|fifty) boats\.")),
        (conversations()[1], GuidedDecodingParams(choice=["yes", "no"])),
        (conversations()[0], None),
    ]
    params = [SamplingParams(temperature=0, max_tokens=64, guided_decoding=g) for _, g in cases]
    ours = ngram.chat([c for c, _ in cases], params, use_tqdm=False)
    theirs = plain.chat([c for c, _ in cases], params, use_tqdm=False)
    assert [o.outputs.token_ids for o in ours] == [o.outputs.token_ids for o in theirs]
    assert json.loads(ours[0].outputs.text).keys() == {"town", "river", "boats"}
    assert sum(o.metrics.num_accepted_tokens for o in ours[:2]) > 0  # constrained rows did speculate
    assert all(o.error_code == 200 for o in ours)


def test_disable_by_batch_size(smollm_path, plain):
    """No request speculates while more than disable_by_batch_size run; one alone does."""
    llm = make_llm(smollm_path, spec={**NGRAM, "disable_by_batch_size": 4}, max_num_seqs=8)
    try:
        params = SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True)
        convs = conversations()[:8]  # 8 run together from first to last step
        outs = llm.chat(convs, params, use_tqdm=False)
        assert [o.metrics.num_draft_tokens for o in outs] == [0] * 8
        assert [o.outputs.token_ids for o in outs] == [o.outputs.token_ids for o in plain.chat(convs, params,
                                                                                               use_tqdm=False)]
        alone = llm.chat(convs[:1], params, use_tqdm=False)[0]
        assert alone.metrics.num_accepted_tokens > 0
    finally:
        llm.shutdown()


def test_draft_model_greedy_tokens_equal_non_speculative(smollm_path, reference):
    """The default model drafting for itself: every draft is the target's own greedy choice, so all
    are accepted but where batch rounding splits a near-tie."""
    llm = make_llm(smollm_path, spec={"method": "draft_model", "model": smollm_path, "num_speculative_tokens": 3})
    try:
        outs = llm.chat(conversations(), SamplingParams(temperature=0, max_tokens=TOKENS), use_tqdm=False)
        assert_same_as_reference(outs, reference, "draft_model")
        drafted = sum(o.metrics.num_draft_tokens for o in outs)
        assert sum(o.metrics.num_accepted_tokens for o in outs) > 0.95 * drafted > 0
        assert_engine_idle(llm)
    finally:
        llm.shutdown()


def test_progress_bar_shows_the_acceptance_rate(ngram, capsys):
    ngram.chat(conversations()[:2], SamplingParams(temperature=0, max_tokens=16), use_tqdm=True)
    assert "accepted drafts: " in capsys.readouterr().err
