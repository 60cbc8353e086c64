"""Stop conditions end to end on the default model: stop strings, stop_token_ids, EOS, min_tokens
and ignore_eos.

Nothing here knows the model's text. Each test picks its stop string or stop id from a live
unstopped greedy run (`story`, `chat_eos` in conftest.py) by a property of that run (a token
boundary, a first occurrence), and the oracle is the same run cut where the option says: the text
before (or through) the first occurrence, the token ids up to the token that completes it.
"""
from helpers import STORY, STORY_TOKENS, chat, first, greedy, run, story_params, token_offsets


def stop_oracle(tok, base, stop, include=False):
    """(text, token ids) a stop string must leave of the unstopped run `base`: the text cut before
    (or after) the first occurrence, and the ids up to the token that completes it."""
    pos = base.text.index(stop)
    text = base.text[: pos + len(stop)] if include else base.text[:pos]
    ids = base.token_ids
    k = next(k for k in range(1, len(ids) + 1) if stop in tok.decode(ids[:k], skip_special_tokens=True))
    return text, ids[:k]


def check_stop(llm, tok, story, stop, include=False):
    out = first(llm, STORY, story_params(stop=[stop], include_stop_str_in_output=include))
    text, ids = stop_oracle(tok, story, stop, include)
    assert out.text == text
    assert out.token_ids == ids
    assert out.finish_reason == "stop" and out.stop_reason == stop
    return out


def spans(tok, story):
    """(k, start, end): generated token k >= 1 is story.text[start:end], at clean boundaries."""
    offs = token_offsets(tok, story.token_ids)
    return [(k, offs[k], offs[k + 1]) for k in range(1, len(story.token_ids))
            if offs[k] is not None and offs[k + 1] is not None and offs[k + 1] > offs[k]]


def adjacent(tok, story):
    """(j, a, b, e): generated tokens j >= 1 and j + 1 are story.text[a:b] and story.text[b:e]."""
    s = spans(tok, story)
    return [(j, a, b, e) for (j, a, b), (j2, b2, e) in zip(s, s[1:]) if j2 == j + 1 and b2 == b]


def first_at(text, stop, pos):
    """A usable stop string: not blank, and its first occurrence in text is at pos."""
    return bool(stop.strip()) and text.find(stop) == pos


def pick(candidates, story, what):
    assert candidates, f"no {what} in the greedy run {story.text!r}"
    return candidates[0]


def one_token_stops(tok, story):
    """(k, stop): token k's text, a single token on its own, first found exactly there."""
    text = story.text
    return [(k, text[a:b]) for k, a, b in spans(tok, story)
            if first_at(text, text[a:b], a) and len(tok.encode(text[a:b], add_special_tokens=False)) == 1]


# ---- stop strings ------------------------------------------------------------------------------
def test_stop_string_of_one_token(smollm_llm, tok, story):
    k, stop = pick(one_token_stops(tok, story), story, "single-token piece")
    out = check_stop(smollm_llm, tok, story, stop)
    assert out.token_ids == story.token_ids[: k + 1]  # the completing token stays in token_ids


def test_stop_string_of_several_tokens(smollm_llm, tok, story):
    text = story.text
    pairs = [(j, text[a:e]) for j, a, b, e in adjacent(tok, story)
             if first_at(text, text[a:e], a) and len(tok.encode(text[a:e], add_special_tokens=False)) >= 2]
    j, stop = pick(pairs, story, "two-token piece")
    out = check_stop(smollm_llm, tok, story, stop)
    assert out.token_ids == story.token_ids[: j + 2]


def test_stop_string_ending_inside_a_token_cuts_exactly_before_it(smollm_llm, tok, story):
    """The stop covers token j and all but the last character of token j + 1."""
    text, bounds = story.text, set(token_offsets(tok, story.token_ids))
    found = [(j, a, text[a : e - 1]) for j, a, b, e in adjacent(tok, story)
             if e - b >= 2 and first_at(text, text[a : e - 1], a)]
    j, start, stop = pick(found, story, "token of 2+ characters after another")
    assert start + len(stop) not in bounds
    out = check_stop(smollm_llm, tok, story, stop)
    assert out.text == text[:start] and out.token_ids == story.token_ids[: j + 2]


def test_stop_string_starting_and_ending_inside_tokens_with_include(smollm_llm, tok, story):
    """The stop starts after the first character of token j and ends before the last of token j+1."""
    text, bounds = story.text, set(token_offsets(tok, story.token_ids))
    found = [(j, a + 1, text[a + 1 : e - 1]) for j, a, b, e in adjacent(tok, story)
             if b - a >= 2 and e - b >= 2 and first_at(text, text[a + 1 : e - 1], a + 1)]
    j, pos, stop = pick(found, story, "two adjacent tokens of 2+ characters")
    assert pos not in bounds and pos + len(stop) not in bounds
    out = check_stop(smollm_llm, tok, story, stop, include=True)
    assert out.text.endswith(stop) and out.text == text[: pos + len(stop)]
    assert out.token_ids == story.token_ids[: j + 2]


def test_include_stop_str_in_output_keeps_a_multi_token_stop(smollm_llm, tok, story):
    text, offs = story.text, token_offsets(tok, story.token_ids)
    starts = [k for k in range(1, STORY_TOKENS - 2) if offs[k] is not None and offs[k + 3] is not None
              and text[offs[k] : offs[k + 3]].strip()]
    k = pick(starts, story, "run of three tokens")
    stop = text[offs[k] : offs[k + 3]].strip()
    out = check_stop(smollm_llm, tok, story, stop, include=True)
    assert out.text.endswith(stop)


def test_with_several_stop_strings_the_earliest_in_the_text_wins(smollm_llm, tok, story):
    text = story.text
    # one token (j + 1) completes both; the list order must not decide: the one starting earlier wins
    same = [(text[b + 1 : e], text[a:e]) for j, a, b, e in adjacent(tok, story)
            if e - b >= 3 and first_at(text, text[b + 1 : e], b + 1) and first_at(text, text[a:e], a)]
    suffix, longer = pick(same, story, "token of 3+ characters after another")
    # completed by different tokens: the one completed first wins, wherever it is in the list
    singles = one_token_stops(tok, story)
    assert len(singles) >= 2, f"fewer than two single-token pieces in {text!r}"
    earlier, later = singles[0][1], singles[-1][1]
    a, b = run(smollm_llm, [STORY, STORY],
               [story_params(stop=[suffix, longer]), story_params(stop=[later, earlier])])
    for out, stop in ((a, longer), (b, earlier)):
        text_cut, ids = stop_oracle(tok, story, stop)
        assert (out.outputs.text, out.outputs.token_ids, out.outputs.stop_reason) == (text_cut, ids, stop)
        assert out.outputs.finish_reason == "stop"


def test_stop_strings_are_matched_in_the_generated_text_only(smollm_llm, tok, story):
    text, offs = story.text, token_offsets(tok, story.token_ids)
    in_prompt = [w for w in STORY.split() if w not in text]
    spanning = STORY.split()[-1] + text[: offs[1]]  # the prompt's last word + the first token's text
    assert offs[1] and in_prompt and spanning not in text and (STORY + text).find(spanning) >= 0
    out = first(smollm_llm, STORY, story_params(stop=[in_prompt[0], spanning]))
    assert out.token_ids == story.token_ids and out.text == text
    assert out.finish_reason == "length" and out.stop_reason is None


def test_stop_string_completed_before_min_tokens_is_ignored(smollm_llm, tok, story):
    once = [(k, stop) for k, stop in one_token_stops(tok, story)
            if story.text.count(stop) == 1 and k + 2 <= STORY_TOKENS]
    k, stop = pick(once, story, "single-token piece found once")
    out = first(smollm_llm, STORY, story_params(stop=[stop], min_tokens=k + 2))  # completed at k + 1 tokens
    assert out.token_ids == story.token_ids and out.text == story.text
    assert out.finish_reason == "length" and out.stop_reason is None


# ---- stop_token_ids ----------------------------------------------------------------------------
def first_occurrences(ids):
    """Positions k >= 1 where ids[k] appears for the first time."""
    return [k for k in range(1, len(ids)) if ids[k] not in ids[:k]]


def test_stop_token_ids_end_at_the_first_listed_id_generated(smollm_llm, tok, story):
    ids = story.token_ids
    ks = first_occurrences(ids)
    assert len(ks) >= 2, ids
    first_id, later_id = ids[ks[0]], ids[ks[-1]]
    out = first(smollm_llm, STORY, story_params(stop_token_ids=[later_id, first_id]))
    assert out.token_ids == ids[: ks[0] + 1] and out.token_ids[-1] == first_id
    assert out.finish_reason == "stop" and out.stop_reason == first_id
    # vLLM's rule: the stop token stays in token_ids, its text is left out of text ...
    assert out.text == tok.decode(ids[: ks[0]], skip_special_tokens=True)
    kept = first(smollm_llm, STORY, story_params(stop_token_ids=[first_id], include_stop_str_in_output=True))
    assert kept.token_ids == ids[: ks[0] + 1]
    assert kept.text == tok.decode(ids[: ks[0] + 1], skip_special_tokens=True)  # ... unless asked to keep it


def test_stop_token_ids_are_masked_until_min_tokens(smollm_llm, story):
    ids = story.token_ids
    j = first_occurrences(ids)[0]
    banned, min_tokens = ids[j], j + 3
    out = first(smollm_llm, STORY, story_params(min_tokens=min_tokens, stop_token_ids=[banned]))
    assert banned not in out.token_ids[:min_tokens]
    assert out.token_ids[:j] == ids[:j]  # masking a token greedy did not pick there changes nothing
    if banned in out.token_ids:
        assert out.token_ids.index(banned) == len(out.token_ids) - 1
        assert out.finish_reason == "stop" and out.stop_reason == banned
    else:
        assert out.finish_reason == "length" and len(out.token_ids) == STORY_TOKENS


# ---- lengths and EOS ---------------------------------------------------------------------------
def test_eos_ends_a_chat_answer_with_stop_and_no_stop_reason(smollm_llm, tok, chat_eos):
    free, eos = chat_eos.out, chat_eos.eos
    assert free.finish_reason == "stop" and free.stop_reason is None
    assert free.token_ids[-1] == eos and eos not in free.token_ids[:-1]
    assert free.text == tok.decode(free.token_ids, skip_special_tokens=True)
    assert chat_eos.eos_text not in free.text
    # the EOS text is left out even when special tokens are kept, unless include_stop_str_in_output
    n = len(free.token_ids) + 4
    shown = chat(smollm_llm, chat_eos.conv, greedy(n, skip_special_tokens=False))[0].outputs
    assert shown.token_ids == free.token_ids and shown.text == free.text
    kept = chat(smollm_llm, chat_eos.conv, greedy(n, skip_special_tokens=False, include_stop_str_in_output=True))
    assert kept[0].outputs.token_ids == free.token_ids
    assert kept[0].outputs.text == free.text + chat_eos.eos_text


def test_ignore_eos_generates_exactly_max_tokens(smollm_llm, chat_eos):
    free = chat_eos.out
    n = len(free.token_ids) + 6
    out = chat(smollm_llm, chat_eos.conv, greedy(n, ignore_eos=True))[0].outputs
    assert len(out.token_ids) == n
    assert out.finish_reason == "length" and out.stop_reason is None
    # EOS was generated where the free run ended, and did not end this one
    assert out.token_ids[: len(free.token_ids)] == free.token_ids


def test_ignore_eos_still_stops_on_eos_listed_in_stop_token_ids(smollm_llm, chat_eos):
    free, eos = chat_eos.out, chat_eos.eos
    out = chat(smollm_llm, chat_eos.conv, greedy(len(free.token_ids) + 4, ignore_eos=True, stop_token_ids=[eos]))
    assert out[0].outputs.token_ids == free.token_ids
    assert out[0].outputs.finish_reason == "stop" and out[0].outputs.stop_reason == eos


def test_min_tokens_equal_to_max_tokens_gives_exactly_that_many(smollm_llm, chat_eos):
    free, eos = chat_eos.out, chat_eos.eos
    n = len(free.token_ids) + 4
    out = chat(smollm_llm, chat_eos.conv, greedy(n, min_tokens=n))[0].outputs
    assert len(out.token_ids) == n and eos not in out.token_ids
    assert out.finish_reason == "length" and out.stop_reason is None
    # masking EOS changes nothing before the position where the free run produced it
    eos_at = len(free.token_ids) - 1
    assert out.token_ids[:eos_at] == free.token_ids[:eos_at]


def test_min_tokens_below_max_tokens_only_delays_eos(smollm_llm, chat_eos):
    free, eos = chat_eos.out, chat_eos.eos
    m, n = len(free.token_ids) + 2, len(free.token_ids) + 12
    out = chat(smollm_llm, chat_eos.conv, greedy(n, min_tokens=m))[0].outputs
    assert len(out.token_ids) >= m and eos not in out.token_ids[:m]
    assert out.token_ids[: m - 3] == free.token_ids[: m - 3]
    if out.finish_reason == "stop":
        assert out.token_ids[-1] == eos and eos not in out.token_ids[:-1] and out.stop_reason is None
    else:
        assert out.finish_reason == "length" and len(out.token_ids) == n
