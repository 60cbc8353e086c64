"""The SamplingParams contract end to end, through LLM.generate / LLM.chat on the default model.

Oracles: greedy runs without the option under test (a stop option must cut the unstopped run's
text and token ids exactly where the option says), the tokenizer, exact-length rules, and
logprobs recomputed as prompt logprobs of the same sequence.
"""
import dataclasses
import math

import pytest

from fastdeploy import SamplingParams
from fastdeploy.engine.request import CompletionOutput, CompletionOutputs, Logprob, RequestMetrics, RequestOutput

EOS = 2  # <|im_end|>
STORY = "Once upon a time"  # greedy: ", the city of Nova Haven was a thriving metropolis, with ..."
REPEAT = "List: apple, apple, apple, apple,"  # greedy repeats " apple," forever
CHAT = [{"role": "user", "content": "Reply with one word: yes or no?"}]  # greedy: "Yes." + EOS


def greedy(max_tokens=12, **kwargs):
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def run(llm, prompts, params):
    return llm.generate(prompts, params, use_tqdm=False)


def _contains(ids, seq):
    seq = list(seq)
    return any(ids[i : i + len(seq)] == seq for i in range(len(ids) - len(seq) + 1))


@pytest.fixture(scope="module")
def tok(smollm_llm):
    return smollm_llm.get_tokenizer()


@pytest.fixture(scope="module")
def story(smollm_llm):
    """The unstopped greedy continuation of STORY: 12 tokens, no EOS."""
    out = run(smollm_llm, STORY, greedy())[0].outputs
    assert out.finish_reason == "length" and len(out.token_ids) == 12
    return out


@pytest.fixture(scope="module")
def chat_free(smollm_llm):
    """The greedy chat answer to CHAT, which ends by itself with EOS."""
    out = smollm_llm.chat(CHAT, greedy(16), use_tqdm=False)[0].outputs
    assert out.finish_reason == "stop" and out.token_ids[-1] == EOS and len(out.token_ids) <= 6
    return out


def _stop_oracle(tok, base, stop, include=False):
    """(text, token ids) a stop string must leave: the text cut before (or after) its first
    occurrence, and the ids up to the token that completes it."""
    pos = base.text.index(stop)
    text = base.text[: pos + len(stop)] if include else base.text[:pos]
    k = next(k for k in range(1, len(base.token_ids) + 1) if stop in tok.decode(base.token_ids[:k]))
    return text, base.token_ids[:k]


def _boundaries(tok, ids):
    """Character offsets of the token boundaries in decode(ids)."""
    return {len(tok.decode(ids[:k])) for k in range(len(ids) + 1)}


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
        assert len(c.token_ids) == 8 or c.token_ids[-1] == EOS
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
    out = run(smollm_llm, STORY, greedy(6, n=1))[0]
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
        assert all(len(c.token_ids) == 4 or c.token_ids[-1] == EOS for c in o.outputs)
    # n per prompt from a list of params
    mixed = run(smollm_llm, prompts[:3], [SamplingParams(n=k, temperature=1.0, max_tokens=3) for k in (1, 3, 2)])
    assert [len(o.outputs) for o in mixed] == [1, 3, 2]
    assert [o.prompt for o in mixed] == prompts[:3]


def test_stop_strings_apply_to_each_of_n_completions(smollm_llm, tok):
    stop = " the"
    out = run(smollm_llm, STORY, SamplingParams(n=4, temperature=1.0, seed=21, max_tokens=12, stop=stop))[0]
    assert len(out.outputs) == 4
    for c in out.outputs:
        full = tok.decode(c.token_ids, skip_special_tokens=True)
        assert stop not in c.text
        if c.finish_reason == "stop" and c.stop_reason == stop:
            assert c.text == full[: full.index(stop)]
            assert stop not in tok.decode(c.token_ids[:-1], skip_special_tokens=True)
        else:
            assert stop not in full
    assert any(c.stop_reason == stop for c in out.outputs)


def test_n_greater_than_1_with_greedy_is_rejected():
    with pytest.raises(ValueError, match=r"\bn\b"):
        SamplingParams(n=2, temperature=0)


# ---- stop strings ------------------------------------------------------------------------------
def _check_stop(smollm_llm, tok, story, stop, include=False):
    out = run(smollm_llm, STORY, greedy(stop=[stop], include_stop_str_in_output=include))[0].outputs
    text, ids = _stop_oracle(tok, story, stop, include)
    assert out.text == text
    assert out.token_ids == ids
    assert out.finish_reason == "stop" and out.stop_reason == stop
    return out


def test_stop_string_of_one_token(smollm_llm, tok, story):
    stop = tok.decode(story.token_ids[2:3])  # " city"
    assert len(tok.encode(stop, add_special_tokens=False)) == 1
    out = _check_stop(smollm_llm, tok, story, stop)
    assert out.token_ids == story.token_ids[:3]  # the completing token stays in token_ids


def test_stop_string_of_several_tokens(smollm_llm, tok, story):
    stop = tok.decode(story.token_ids[4:6])  # " Nova Haven"
    assert len(tok.encode(stop, add_special_tokens=False)) >= 2
    out = _check_stop(smollm_llm, tok, story, stop)
    assert out.token_ids == story.token_ids[:6]


def test_stop_string_ending_inside_a_token_cuts_exactly_before_it(smollm_llm, tok, story):
    full = tok.decode(story.token_ids[:10])  # ... " a thriving metropolis"
    stop = "thriving metrop"  # ends inside " metropolis"
    start = full.index(stop)
    bounds = _boundaries(tok, story.token_ids)
    assert start + len(stop) not in bounds
    out = _check_stop(smollm_llm, tok, story, stop)
    assert out.text == full[:start] and out.text.endswith(" a ")


def test_stop_string_starting_and_ending_inside_tokens_with_include(smollm_llm, tok, story):
    stop = "ova Hav"  # starts inside " Nova", ends inside " Haven"
    pos = story.text.index(stop)
    bounds = _boundaries(tok, story.token_ids)
    assert pos not in bounds and pos + len(stop) not in bounds
    out = _check_stop(smollm_llm, tok, story, stop, include=True)
    assert out.text.endswith(stop) and out.text == story.text[: pos + len(stop)]


def test_include_stop_str_in_output_keeps_a_multi_token_stop(smollm_llm, tok, story):
    stop = tok.decode(story.token_ids[7:10]).strip()  # "a thriving metropolis"
    out = _check_stop(smollm_llm, tok, story, stop, include=True)
    assert out.text.endswith(stop)


def test_with_several_stop_strings_the_earliest_in_the_text_wins(smollm_llm, tok, story):
    # one token (" metropolis") completes both; the list order must not decide
    same_token = ["tropolis", " thriving metropolis"]
    # " Nova" is completed long before " thriving"
    earlier_token = [" thriving", " Nova"]
    a, b = run(smollm_llm, [STORY, STORY], [greedy(stop=same_token), greedy(stop=earlier_token)])
    text, ids = _stop_oracle(tok, story, " thriving metropolis")
    assert (a.outputs.text, a.outputs.token_ids, a.outputs.stop_reason) == (text, ids, " thriving metropolis")
    text, ids = _stop_oracle(tok, story, " Nova")
    assert (b.outputs.text, b.outputs.token_ids, b.outputs.stop_reason) == (text, ids, " Nova")
    assert a.outputs.finish_reason == b.outputs.finish_reason == "stop"


def test_stop_strings_are_matched_in_the_generated_text_only(smollm_llm, story):
    # "Once" is in the prompt, "time," spans the prompt and the first generated token
    assert "Once" not in story.text and "time" not in story.text
    out = run(smollm_llm, STORY, greedy(stop=["Once", "time,"]))[0].outputs
    assert out.token_ids == story.token_ids and out.text == story.text
    assert out.finish_reason == "length" and out.stop_reason is None


def test_stop_string_completed_before_min_tokens_is_ignored(smollm_llm, story):
    stop = " city"  # completed by the 3rd token, and nowhere later
    assert story.text.count(stop) == 1
    out = run(smollm_llm, STORY, greedy(stop=[stop], min_tokens=5))[0].outputs
    assert out.token_ids == story.token_ids and out.text == story.text
    assert out.finish_reason == "length" and out.stop_reason is None


# ---- stop_token_ids ----------------------------------------------------------------------------
def test_stop_token_ids_end_at_the_first_listed_id_generated(smollm_llm, tok, story):
    ids = story.token_ids
    later, first = ids[8], ids[3]  # " thriving", " of"
    assert later not in ids[:8] and first not in ids[:3]
    out = run(smollm_llm, STORY, greedy(stop_token_ids=[later, first]))[0].outputs
    assert out.token_ids == ids[:4] and out.token_ids[-1] == first
    assert out.finish_reason == "stop" and out.stop_reason == first
    # vLLM's rule: the stop token stays in token_ids, its text is left out of text ...
    assert out.text == tok.decode(ids[:3], skip_special_tokens=True)
    kept = run(smollm_llm, STORY, greedy(stop_token_ids=[first], include_stop_str_in_output=True))[0].outputs
    assert kept.token_ids == ids[:4]
    assert kept.text == tok.decode(ids[:4], skip_special_tokens=True)  # ... unless asked to keep it


def test_stop_token_ids_are_masked_until_min_tokens(smollm_llm, story):
    the = story.token_ids[1]  # " the", the 2nd greedy token
    out = run(smollm_llm, STORY, greedy(min_tokens=4, stop_token_ids=[the]))[0].outputs
    assert the not in out.token_ids[:4]
    assert out.token_ids[0] == story.token_ids[0]
    if the in out.token_ids:
        assert out.token_ids[-1] == the and out.token_ids.index(the) == len(out.token_ids) - 1
        assert out.finish_reason == "stop" and out.stop_reason == the
    else:
        assert out.finish_reason == "length" and len(out.token_ids) == 12


# ---- lengths and EOS ---------------------------------------------------------------------------
def test_eos_ends_a_chat_answer_with_stop_and_no_stop_reason(smollm_llm, tok, chat_free):
    assert chat_free.finish_reason == "stop" and chat_free.stop_reason is None
    assert chat_free.token_ids[-1] == EOS and EOS not in chat_free.token_ids[:-1]
    assert chat_free.text == tok.decode(chat_free.token_ids, skip_special_tokens=True)
    assert "<|im_end|>" not in chat_free.text
    # the EOS text is left out even when special tokens are kept, unless include_stop_str_in_output
    shown = smollm_llm.chat(CHAT, greedy(16, skip_special_tokens=False), use_tqdm=False)[0].outputs
    assert shown.token_ids == chat_free.token_ids and shown.text == chat_free.text
    kept = smollm_llm.chat(CHAT, greedy(16, skip_special_tokens=False, include_stop_str_in_output=True),
                           use_tqdm=False)[0].outputs
    assert kept.token_ids == chat_free.token_ids
    assert kept.text == chat_free.text + "<|im_end|>"


def test_ignore_eos_generates_exactly_max_tokens(smollm_llm, chat_free):
    n = len(chat_free.token_ids) + 6
    out = smollm_llm.chat(CHAT, greedy(n, ignore_eos=True), use_tqdm=False)[0].outputs
    assert len(out.token_ids) == n
    assert out.finish_reason == "length" and out.stop_reason is None
    # EOS was generated where the free run ended, and did not end this one
    assert out.token_ids[: len(chat_free.token_ids)] == chat_free.token_ids


def test_ignore_eos_still_stops_on_eos_listed_in_stop_token_ids(smollm_llm, chat_free):
    out = smollm_llm.chat(CHAT, greedy(16, ignore_eos=True, stop_token_ids=[EOS]), use_tqdm=False)[0].outputs
    assert out.token_ids == chat_free.token_ids
    assert out.finish_reason == "stop" and out.stop_reason == EOS


def test_min_tokens_equal_to_max_tokens_gives_exactly_that_many(smollm_llm, chat_free):
    n = len(chat_free.token_ids) + 4
    out = smollm_llm.chat(CHAT, greedy(n, min_tokens=n), use_tqdm=False)[0].outputs
    assert len(out.token_ids) == n and EOS not in out.token_ids
    assert out.finish_reason == "length" and out.stop_reason is None
    # masking EOS changes nothing before the position where the free run produced it
    eos_at = len(chat_free.token_ids) - 1
    assert out.token_ids[:eos_at] == chat_free.token_ids[:eos_at]


def test_min_tokens_below_max_tokens_only_delays_eos(smollm_llm, chat_free):
    m = len(chat_free.token_ids) + 2
    out = smollm_llm.chat(CHAT, greedy(16, min_tokens=m), use_tqdm=False)[0].outputs
    assert len(out.token_ids) >= m and EOS not in out.token_ids[:m]
    if out.finish_reason == "stop":
        assert out.token_ids[-1] == EOS and EOS not in out.token_ids[:-1]
    else:
        assert out.finish_reason == "length" and len(out.token_ids) == 16


# ---- seeds -------------------------------------------------------------------------------------
SEEDED = SamplingParams(temperature=1.0, top_p=0.9, seed=1234, max_tokens=12)


def test_seeded_request_is_the_same_alone_in_any_batch_and_again(smollm_llm):
    alone = run(smollm_llm, STORY, SEEDED)[0].outputs.token_ids
    other = SamplingParams(temperature=1.0, max_tokens=12)
    batch_a = run(smollm_llm, ["The sea is", "Hi there, how", STORY, "Paris is"],
                  [other, SamplingParams(temperature=1.0, seed=7, max_tokens=9), SEEDED, other])
    batch_b = run(smollm_llm, [STORY, "1, 2, 3, 4," * 5, "Tell me about cats"],
                  [SEEDED, SamplingParams(temperature=0.7, top_k=20, seed=99, max_tokens=12), other])
    again = run(smollm_llm, STORY, SEEDED)[0].outputs.token_ids
    assert len(alone) == 12 or alone[-1] == EOS
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


# ---- abort -------------------------------------------------------------------------------------
def test_abort_mid_generation_frees_everything_and_spares_the_others(smollm_llm, tok, story):
    engine = smollm_llm.llm_engine
    pool = engine.block_pool
    assert not engine.has_unfinished_requests() and pool.num_free_blocks == pool.num_usable_blocks
    ids = tok.encode(STORY, add_special_tokens=False)
    victim = engine.add_request(STORY, ids, greedy(30))
    group = engine.add_request(STORY, ids, SamplingParams(n=2, temperature=1.0, seed=5, max_tokens=30))
    survivor = engine.add_request(STORY, ids, greedy())
    finished = []
    for _ in range(4):
        finished += engine.step()
    assert finished == [] and pool.num_free_blocks < pool.num_usable_blocks
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
    assert not engine.has_unfinished_requests()
    assert pool.num_free_blocks == pool.num_usable_blocks
    # a request aborted before it ever ran
    waiting = engine.add_request(STORY, ids, greedy(8))
    out = engine.abort_request(waiting)
    assert out.outputs.finish_reason == "abort" and out.outputs.token_ids == []
    assert not engine.has_unfinished_requests() and pool.num_free_blocks == pool.num_usable_blocks
    # the LLM still works
    assert run(smollm_llm, STORY, greedy())[0].outputs.token_ids == story.token_ids


def test_abort_right_after_add_leaves_the_engine_clean(smollm_llm, tok):
    engine = smollm_llm.llm_engine
    pool = engine.block_pool
    ids = tok.encode("Hello", add_special_tokens=False)
    rid = engine.add_request("Hello", ids, greedy(4))
    engine.step()  # prefill: blocks taken
    assert pool.num_free_blocks < pool.num_usable_blocks
    engine.abort_request(rid)
    assert engine.step() == [] and not engine.has_unfinished_requests()
    assert pool.num_free_blocks == pool.num_usable_blocks


# ---- output fields -----------------------------------------------------------------------------
def _is_opt(value, types):
    return value is None or isinstance(value, types)


def test_every_output_field_is_present_with_its_type(smollm_llm):
    outs = run(smollm_llm, [STORY, "The sea is"],
               [greedy(6), SamplingParams(n=2, temperature=1.0, max_tokens=6)])
    for out in outs:
        assert isinstance(out, RequestOutput)
        assert isinstance(out.request_id, str) and out.request_id
        assert isinstance(out.prompt, str)
        assert isinstance(out.prompt_token_ids, list) and all(type(t) is int for t in out.prompt_token_ids)
        assert isinstance(out.outputs, CompletionOutputs)
        assert out.finished is True
        assert isinstance(out.num_cached_tokens, int) and out.num_cached_tokens >= 0
        assert out.error_code == 200 and out.error_msg is None
        assert out.prompt_logprobs is None
        for c in out.outputs:
            assert isinstance(c.index, int)
            assert isinstance(c.send_idx, int) and c.send_idx == len(c.token_ids)
            assert isinstance(c.token_ids, list) and all(type(t) is int for t in c.token_ids)
            assert isinstance(c.text, str)
            assert _is_opt(c.reasoning_content, str)
            assert c.finish_reason in ("stop", "length")
            assert _is_opt(c.stop_reason, (int, str))
            assert c.cumulative_logprob is None and c.logprobs is None  # not asked for
        m = out.metrics
        assert isinstance(m, RequestMetrics)
        times = [m.arrival_time, m.inference_start_time, m.first_token_time, m.time_in_queue,
                 m.model_forward_time, m.model_execute_time]
        assert all(isinstance(t, float) and t >= 0 for t in times), times
        assert m.arrival_time <= m.inference_start_time
        assert m.first_token_time <= m.model_forward_time
        assert m.model_execute_time >= m.time_in_queue
        assert m.model_execute_time >= m.model_forward_time


def _check_logprobs_dict(d, token_id, k, tok):
    assert token_id in d
    assert k <= len(d) <= k + 1
    for tid, lp in d.items():
        assert isinstance(lp, Logprob) and isinstance(lp.rank, int) and lp.rank >= 1
        assert lp.logprob <= 0 and math.isfinite(lp.logprob)
        assert lp.decoded_token == tok.decode([tid])
    assert sorted(lp.rank for lp in d.values())[:k] == list(range(1, k + 1))  # the top k
    # ranks agree with the values: more likely = smaller rank
    for a in d.values():
        for b in d.values():
            if a.logprob > b.logprob + 1e-6:
                assert a.rank < b.rank


def test_logprobs_of_generated_tokens(smollm_llm, tok):
    out = run(smollm_llm, STORY, greedy(8, logprobs=2))[0]
    c = out.outputs
    assert isinstance(c.logprobs, list) and len(c.logprobs) == len(c.token_ids) == 8
    for d, t in zip(c.logprobs, c.token_ids):
        _check_logprobs_dict(d, t, 2, tok)
        assert d[t].rank == 1  # greedy picks the most likely token
        assert d[t].logprob == max(lp.logprob for lp in d.values())
    assert isinstance(c.cumulative_logprob, float)
    assert c.cumulative_logprob == pytest.approx(sum(d[t].logprob for d, t in zip(c.logprobs, c.token_ids)), abs=1e-4)
    # the same numbers as the prompt logprobs of prompt + output (another code path: prefill)
    full = out.prompt_token_ids + c.token_ids
    again = run(smollm_llm, {"prompt_token_ids": full}, greedy(1, prompt_logprobs=0))[0]
    n = len(out.prompt_token_ids)
    for i, t in enumerate(c.token_ids):
        assert list(again.prompt_logprobs[n + i]) == [t]  # prompt_logprobs=0: the actual token only
        assert again.prompt_logprobs[n + i][t].logprob == pytest.approx(c.logprobs[i][t].logprob, abs=2e-3)
        assert again.prompt_logprobs[n + i][t].rank == 1


def test_logprobs_of_sampled_tokens_hold_the_sampled_one(smollm_llm, tok):
    c = run(smollm_llm, STORY, SamplingParams(temperature=1.5, seed=5, max_tokens=10, logprobs=2))[0].outputs
    assert len(c.logprobs) == len(c.token_ids)
    for d, t in zip(c.logprobs, c.token_ids):
        _check_logprobs_dict(d, t, 2, tok)
        if len(d) == 3:
            assert d[t].rank > 2
    assert c.cumulative_logprob == pytest.approx(sum(d[t].logprob for d, t in zip(c.logprobs, c.token_ids)), abs=1e-4)


def test_prompt_logprobs(smollm_llm, tok):
    out = run(smollm_llm, STORY, greedy(2, prompt_logprobs=1))[0]
    pl = out.prompt_logprobs
    assert isinstance(pl, list) and len(pl) == len(out.prompt_token_ids)
    assert pl[0] is None
    for d, t in zip(pl[1:], out.prompt_token_ids[1:]):
        _check_logprobs_dict(d, t, 1, tok)
    assert out.outputs.logprobs is None and out.outputs.cumulative_logprob is None


# ---- penalties and bad words -------------------------------------------------------------------
def test_penalties_change_a_repeating_continuation(smollm_llm, tok):
    base, presence, repetition = run(smollm_llm, [REPEAT] * 3, [
        greedy(12), greedy(12, presence_penalty=2.0), greedy(12, repetition_penalty=1.3)])
    apple = tok.encode(" apple,", add_special_tokens=False)
    assert base.outputs.token_ids[: 3 * len(apple)] == apple * 3  # the model repeats
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


def test_bad_word_of_one_token_is_never_generated(smollm_llm, tok, story):
    word = tok.decode(story.token_ids[2:3]).strip()  # "city", generated as " city"
    out = run(smollm_llm, STORY, greedy(bad_words=[word]))[0].outputs
    for variant in (word, " " + word):
        assert not _contains(out.token_ids, tok.encode(variant, add_special_tokens=False))
    # unchanged up to the banned position, then something else
    assert out.token_ids[:2] == story.token_ids[:2] and out.token_ids[2] != story.token_ids[2]


def test_bad_word_of_several_tokens_is_never_completed(smollm_llm, tok, story):
    word = tok.decode(story.token_ids[4:6]).strip()  # "Nova Haven", generated as " Nova", " Haven"
    seq = tok.encode(" " + word, add_special_tokens=False)
    assert len(seq) == 2 and _contains(story.token_ids, seq)
    out = run(smollm_llm, STORY, greedy(bad_words=[word]))[0].outputs
    for variant in (word, " " + word):
        assert not _contains(out.token_ids, tok.encode(variant, add_special_tokens=False))
    # its first token is still allowed; only the completion is banned
    assert out.token_ids[:5] == story.token_ids[:5] and out.token_ids[5] != story.token_ids[5]
    assert word not in out.text


def test_bad_words_token_ids(smollm_llm, story):
    banned = story.token_ids[2]
    out = run(smollm_llm, STORY, greedy(bad_words_token_ids=[banned]))[0].outputs
    assert banned not in out.token_ids
    assert out.token_ids[:2] == story.token_ids[:2]


def test_n_above_1_is_rejected_when_the_models_default_temperature_is_greedy(smollm_llm, monkeypatch):
    monkeypatch.setitem(smollm_llm.llm_engine.config.generation_config, "temperature", 0.0)
    with pytest.raises(ValueError, match=r"^n must be 1 with greedy decoding"):
        smollm_llm.generate("Once upon a time", SamplingParams(n=2, max_tokens=2), use_tqdm=False)
    assert not smollm_llm.llm_engine.has_unfinished_requests()
