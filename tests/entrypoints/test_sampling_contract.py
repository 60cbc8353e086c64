"""The SamplingParams contract end to end, through LLM.generate on the default model: n > 1,
seeds, penalties, bad words and abort. Stops live in test_stops.py, logprobs and output fields in
test_logprobs_contract.py.

Nothing here knows the model's text: expectations come from live runs without the option under
test (`story` in conftest.py), from the tokenizer, and from the rules each option states.
"""
import dataclasses
import math

import pytest

from fastdeploy import SamplingParams
from fastdeploy.engine.request import CompletionOutput, CompletionOutputs, RequestOutput
from helpers import STORY, assert_engine_idle, blocks_in_use, contains, first, greedy, run, story_params, token_offsets

REPEAT = "List: apple, apple, apple, apple,"  # a prompt that invites repetition (checked, not assumed)


def assert_ended(c, max_tokens, eos):
    """A completion ends at max_tokens ("length") or with an EOS ("stop", no stop_reason)."""
    if c.finish_reason == "length":
        assert len(c.token_ids) == max_tokens
    else:
        assert c.finish_reason == "stop" and c.stop_reason is None and c.token_ids[-1] == eos


# ---- n > 1 -----------------------------------------------------------------------------------
def test_n_3_gives_three_indexed_distinct_completions(smollm_llm, tok):
    out = run(smollm_llm, STORY, SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=8))
    assert len(out) == 1
    out = out[0]
    assert isinstance(out.outputs, CompletionOutputs) and isinstance(out.outputs, list)
    assert len(out.outputs) == 3
    assert [c.index for c in out.outputs] == [0, 1, 2]
    texts = [c.text for c in out.outputs]
    assert len(set(texts)) > 1
    # FastDeploy's attribute access reads the first completion
    assert out.outputs.text == out.outputs[0].text
    assert out.outputs.token_ids == out.outputs[0].token_ids
    assert [c.text for c in out.outputs] == texts  # iteration
    for c in out.outputs:
        assert isinstance(c, CompletionOutput)
        assert_ended(c, 8, tok.eos_token_id)
        assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    # seeded: the same three completions again
    again = run(smollm_llm, STORY, SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=8))[0]
    assert [c.token_ids for c in again.outputs] == [c.token_ids for c in out.outputs]


def test_fastdeploy_attribute_access_reaches_every_completion_field(smollm_llm):
    """FastDeploy code reads `output.outputs.<field>` for every CompletionOutput field, `index`
    included (FastDeploy's `outputs` is one CompletionOutput, not a list)."""
    out = run(smollm_llm, STORY, SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=4, logprobs=1))[0]
    for f in dataclasses.fields(CompletionOutput):
        assert getattr(out.outputs, f.name) == getattr(out.outputs[0], f.name), f.name


def test_n_1_is_a_one_element_list(smollm_llm, story):
    out = run(smollm_llm, STORY, greedy(6, n=1, ignore_eos=True))[0]
    assert isinstance(out.outputs, list) and len(out.outputs) == 1
    assert out.outputs.text == out.outputs[0].text
    assert out.outputs.token_ids == out.outputs[0].token_ids == story.token_ids[:6]
    assert [c.index for c in out.outputs] == [0]


def test_n_2_over_a_list_of_prompts_keeps_input_order(smollm_llm, tok):
    prompts = ["The sea is", STORY, "Paris is a city where", "1, 2, 3,"]
    outs = run(smollm_llm, prompts, SamplingParams(n=2, temperature=1.0, max_tokens=4))
    assert [o.prompt for o in outs] == prompts
    assert [o.prompt_token_ids for o in outs] == [tok.encode(p, add_special_tokens=False) for p in prompts]
    assert len({o.request_id for o in outs}) == len(prompts)
    for o in outs:
        assert len(o.outputs) == 2 and [c.index for c in o.outputs] == [0, 1]
        for c in o.outputs:
            assert_ended(c, 4, tok.eos_token_id)
    # n per prompt from a list of params
    mixed = run(smollm_llm, prompts[:3], [SamplingParams(n=k, temperature=1.0, max_tokens=3) for k in (1, 3, 2)])
    assert [len(o.outputs) for o in mixed] == [1, 3, 2]
    assert [o.prompt for o in mixed] == prompts[:3]


def test_stop_strings_apply_to_each_of_n_completions(smollm_llm, tok):
    """Seeded, the n completions are the same samples with or without a stop string; each is cut
    at the first occurrence of the stop in its own unstopped text, or left whole."""
    params = SamplingParams(n=4, temperature=1.0, seed=21, max_tokens=12, ignore_eos=True)
    free = run(smollm_llm, STORY, params)[0].outputs
    ids0, offs = free[0].token_ids, token_offsets(tok, free[0].token_ids)
    text0 = free[0].text
    # the stop: a token's text in completion 0, first found exactly there
    picks = [text0[offs[k] : offs[k + 1]] for k in range(1, len(ids0)) if offs[k] is not None
             and offs[k + 1] is not None and text0[offs[k] : offs[k + 1]].strip()
             and text0.find(text0[offs[k] : offs[k + 1]]) == offs[k]]
    assert picks, text0
    stop = picks[0]
    out = run(smollm_llm, STORY, params.clone(stop=[stop]))[0].outputs
    assert len(out) == 4
    for c, f in zip(out, free):
        assert stop not in c.text
        if stop in f.text:
            k = next(k for k in range(1, len(f.token_ids) + 1)
                     if stop in tok.decode(f.token_ids[:k], skip_special_tokens=True))
            assert (c.text, c.token_ids) == (f.text[: f.text.index(stop)], f.token_ids[:k])
            assert c.finish_reason == "stop" and c.stop_reason == stop
        else:
            assert (c.text, c.token_ids, c.stop_reason) == (f.text, f.token_ids, None)
    assert out[0].stop_reason == stop


def test_n_greater_than_1_with_greedy_is_rejected():
    with pytest.raises(ValueError, match=r"\bn\b"):
        SamplingParams(n=2, temperature=0)


# ---- seeds -------------------------------------------------------------------------------------
SEEDED = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=12)


def test_seeded_request_is_the_same_alone_in_any_batch_and_again(smollm_llm):
    alone_out = run(smollm_llm, STORY, SEEDED)[0].outputs
    alone = alone_out.token_ids
    other = SamplingParams(temperature=1.0, max_tokens=12)
    batch_a = run(smollm_llm, ["The sea is", "Hi there, how", STORY, "Paris is"],
                  [other, SamplingParams(temperature=1.0, seed=7, max_tokens=9), SEEDED, other])
    batch_b = run(smollm_llm, [STORY, "1, 2, 3, 4," * 5, "Tell me about cats"],
                  [SEEDED, SamplingParams(temperature=0.7, top_k=20, seed=99, max_tokens=12), other])
    again = run(smollm_llm, STORY, SEEDED)[0].outputs.token_ids
    assert_ended(alone_out, 12, smollm_llm.get_tokenizer().eos_token_id)
    assert batch_a[2].outputs.token_ids == alone
    assert batch_b[0].outputs.token_ids == alone
    assert again == alone


def test_unseeded_identical_requests_in_one_batch_differ(smollm_llm):
    params = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)
    a, b = run(smollm_llm, [STORY, STORY], params)
    assert a.outputs.token_ids != b.outputs.token_ids and a.outputs.text != b.outputs.text


def test_different_seeds_give_different_samples(smollm_llm):
    outs = run(smollm_llm, [STORY] * 3, [SEEDED.clone(seed=s, max_tokens=16, ignore_eos=True) for s in (1, 2, 3)])
    ids = [o.outputs.token_ids for o in outs]
    assert len({tuple(i) for i in ids}) == 3


OPEN_PROMPTS = ["My favourite colour is", "The sea is", "Paris is a city where", "I like to eat"]


def sample_first_tokens(llm, prompt, count, **params):
    """The first token of `count` seeded one-token samples (seeds 0..count-1), one batch."""
    outs = run(llm, [prompt] * count, [SamplingParams(seed=s, max_tokens=1, **params) for s in range(count)])
    return [o.outputs.token_ids[0] for o in outs]


def test_seeded_samples_follow_the_models_distribution(smollm_llm):
    """Across seeds, the first token's frequencies match the probabilities the model reports
    (temperature 1, nothing truncated) within 4 standard errors; with top_k=2 only the two most
    likely tokens come out, in proportion to their renormalised probabilities. The prompt is the
    one of OPEN_PROMPTS whose first token is least certain."""
    heads = run(smollm_llm, OPEN_PROMPTS, greedy(1, logprobs=5))
    probs = [{t: math.exp(lp.logprob) for t, lp in o.outputs.logprobs[0].items()} for o in heads]
    i = min(range(len(OPEN_PROMPTS)), key=lambda i: max(probs[i].values()))
    probs = probs[i]
    assert max(probs.values()) < 0.8, f"no open first token among the prompts: {probs}"
    count = 100

    def assert_frequencies(samples, expected):
        for t, p in expected.items():
            f = samples.count(t) / count
            assert abs(f - p) <= 4 * math.sqrt(p * (1 - p) / count) + 1e-9, (t, f, p)

    free = sample_first_tokens(smollm_llm, OPEN_PROMPTS[i], count, temperature=1.0, top_p=1.0, top_k=0)
    assert_frequencies(free, probs)
    top2 = sorted(probs, key=probs.get, reverse=True)[:2]
    samples = sample_first_tokens(smollm_llm, OPEN_PROMPTS[i], count, temperature=1.0, top_p=1.0, top_k=2)
    assert set(samples) <= set(top2)
    assert_frequencies(samples, {t: probs[t] / (probs[top2[0]] + probs[top2[1]]) for t in top2})


# ---- abort -------------------------------------------------------------------------------------
def test_abort_mid_generation_frees_everything_and_spares_the_others(smollm_llm, tok, story):
    engine = smollm_llm.llm_engine
    assert_engine_idle(smollm_llm)
    ids = tok.encode(STORY, add_special_tokens=False)
    victim = engine.add_request(STORY, ids, greedy(30, ignore_eos=True))
    group = engine.add_request(STORY, ids, SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=30))
    survivor = engine.add_request(STORY, ids, story_params())
    finished = []
    for _ in range(4):
        finished += engine.step()
    assert finished == [] and blocks_in_use(smollm_llm) > 0
    out = engine.abort_request(victim)
    assert isinstance(out, RequestOutput) and out.request_id == victim
    assert out.outputs.finish_reason == "abort" and out.outputs.stop_reason is None
    assert 1 <= len(out.outputs.token_ids) <= 4
    assert out.outputs.token_ids == story.token_ids[: len(out.outputs.token_ids)]
    assert out.outputs.text == tok.decode(out.outputs.token_ids, skip_special_tokens=True)
    both = engine.abort_request(group)
    assert [c.finish_reason for c in both.outputs] == ["abort", "abort"]
    assert engine.abort_request(victim) is None  # already gone
    while engine.has_unfinished_requests():
        finished += engine.step()
    assert [o.request_id for o in finished] == [survivor]
    assert finished[0].outputs.token_ids == story.token_ids and finished[0].outputs.finish_reason == "length"
    assert_engine_idle(smollm_llm)
    # a request aborted before it ever ran
    waiting = engine.add_request(STORY, ids, greedy(8))
    out = engine.abort_request(waiting)
    assert out.outputs.finish_reason == "abort" and out.outputs.token_ids == []
    assert_engine_idle(smollm_llm)
    # the LLM still works
    assert first(smollm_llm, STORY, story_params()).token_ids == story.token_ids


def test_abort_right_after_add_leaves_the_engine_clean(smollm_llm, tok):
    engine = smollm_llm.llm_engine
    ids = tok.encode("Hello", add_special_tokens=False)
    rid = engine.add_request("Hello", ids, greedy(4))
    engine.step()  # prefill: blocks taken
    assert blocks_in_use(smollm_llm) > 0
    engine.abort_request(rid)
    assert engine.step() == []
    assert_engine_idle(smollm_llm)


# ---- penalties and bad words -------------------------------------------------------------------
def test_penalties_change_a_repeating_continuation(smollm_llm, tok):
    base, presence, repetition = run(smollm_llm, [REPEAT] * 3, [
        greedy(12, ignore_eos=True), greedy(12, ignore_eos=True, presence_penalty=2.0),
        greedy(12, ignore_eos=True, repetition_penalty=1.3)])
    ids = base.outputs.token_ids
    assert max(ids.count(t) for t in ids) >= 3, f"the unpenalised run does not repeat: {base.outputs.text!r}"
    assert presence.outputs.token_ids != base.outputs.token_ids
    assert repetition.outputs.token_ids != base.outputs.token_ids
    # presence counts output tokens only: nothing is penalised at the first step
    assert presence.outputs.token_ids[0] == base.outputs.token_ids[0]


def test_presence_and_frequency_penalties_follow_their_formula(smollm_llm):
    """Greedy under the penalties picks argmax(logprob - frequency*count - presence*[count>0]) over
    the raw logprobs (logprobs are reported before penalties), checked on the top 20 each step."""
    settings = [(2.0, 0.0), (0.0, 1.0), (0.5, 0.7)]
    outs = run(smollm_llm, [REPEAT] * len(settings), [
        greedy(10, logprobs=20, presence_penalty=p, frequency_penalty=f) for p, f in settings])
    for (presence, frequency), out in zip(settings, outs):
        ids = out.outputs.token_ids
        assert len(out.outputs.logprobs) == len(ids)
        for i, (t, d) in enumerate(zip(ids, out.outputs.logprobs)):
            counts = {x: ids[:i].count(x) for x in d}

            def score(x):
                return d[x].logprob - frequency * counts[x] - presence * (counts[x] > 0)

            assert score(t) >= max(score(x) for x in d) - 1e-4, (presence, frequency, i, t)


def banned_variants(tok, word):
    return [tok.encode(v, add_special_tokens=False) for v in (word, " " + word)]


def first_word_at(tok, ids, width):
    """(k, word): the first k >= 1 where ids[k : k + width] is exactly the encoding of " " + word
    (a word of letters and spaces), and no variant of the word occurs before it completes."""
    for k in range(1, len(ids) - width + 1):
        piece = tok.decode(ids[k : k + width])
        word = piece.strip()
        if (piece.startswith(" ") and word.replace(" ", "").isalpha()
                and tok.encode(piece, add_special_tokens=False) == ids[k : k + width]
                and not any(contains(ids[: k + width - 1], v) for v in banned_variants(tok, word))):
            return k, word
    raise AssertionError(f"no word of {width} token(s) in {tok.decode(ids)!r}")


@pytest.mark.parametrize("width", [1, 2])
def test_bad_word_is_never_generated(smollm_llm, tok, story, width):
    """A bad word of one token is never generated; of several, its first tokens still are and only
    its completion is banned. The word is one greedy generates, so the output must change there."""
    ids = story.token_ids
    k, word = first_word_at(tok, ids, width)
    last = k + width - 1  # the position of the token that completes the word
    out = first(smollm_llm, STORY, story_params(bad_words=[word]))
    for variant in banned_variants(tok, word):
        assert not contains(out.token_ids, variant)
    assert out.token_ids[:last] == ids[:last] and out.token_ids[last] != ids[last]
    if width > 1:
        assert word not in out.text


def test_bad_words_token_ids(smollm_llm, story):
    ids = story.token_ids
    k = next(k for k in range(1, len(ids)) if ids[k] not in ids[:k])
    out = first(smollm_llm, STORY, story_params(bad_words_token_ids=[ids[k]]))
    assert ids[k] not in out.token_ids
    assert out.token_ids[:k] == ids[:k]


def test_n_above_1_is_rejected_when_the_models_default_temperature_is_greedy(smollm_llm, monkeypatch):
    monkeypatch.setitem(smollm_llm.llm_engine.config.generation_config, "temperature", 0.0)
    with pytest.raises(ValueError, match=r"^n must be 1 with greedy decoding"):
        smollm_llm.generate(STORY, SamplingParams(n=2, max_tokens=2), use_tqdm=False)
    assert_engine_idle(smollm_llm)
