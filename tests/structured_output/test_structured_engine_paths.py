"""Structured outputs through the engine's other paths: preemption and recompute, chunked prefill and
prefix-cache hits change no token; raw logprobs are the model's, processed ones see the mask; EOS only
where the grammar may end; with a reasoning parser the constraint starts after `</think>`."""
import re

import numpy as np
import pytest
from constraints import IPV4, PERSON, PERSON_CHAT, validate_json
from helpers import assert_engine_idle, assert_same_greedy, chat, run, top2_gaps

from fastdeploy import LLM, GuidedDecodingParams, SamplingParams
from fastdeploy.model_executor.layers.sample.token_bitmask import allowed_tokens
from fastdeploy.structured_output import StructuredOutputManager

CHATS = [PERSON_CHAT, [{"role": "user", "content": "Give an IP address."}],
         [{"role": "user", "content": "Pick a color."}], PERSON_CHAT + [{"role": "assistant", "content": "Sure."},
                                                                      {"role": "user", "content": "Another one."}]]


def params_for(logprobs=2):
    kinds = [{"json": PERSON}, {"regex": IPV4}, {"choice": ["red", "green", "blue"]}, {"json": PERSON}]
    return [SamplingParams(temperature=0, max_tokens=150, logprobs=logprobs, guided_decoding=GuidedDecodingParams(**k))
            for k in kinds]


@pytest.fixture(scope="module")
def reference_llm():
    llm = LLM(max_model_len=512, block_size=16, enable_prefix_caching=False, logprobs_mode="processed_logprobs")
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def squeezed_llm():
    """Chunked prefill in 24-token steps and a pool of 24 blocks of 8 tokens (one 192-token sequence):
    the four requests keep preempting each other; prefix caching on."""
    llm = LLM(max_model_len=192, block_size=8, num_gpu_blocks_override=25, enable_chunked_prefill=True,
              max_num_batched_tokens=24, max_num_seqs=4, logprobs_mode="processed_logprobs")
    yield llm
    llm.shutdown()


def test_preemption_chunked_prefill_and_prefix_hits_change_no_token(reference_llm, squeezed_llm, preemptions):
    """Processed logprobs (after the mask) give the top-2 gaps among the allowed tokens, so a near-tie
    is judged where the constrained choice was made."""
    reference = chat(reference_llm, CHATS, params_for())
    for attempt in ("cold", "prefix hits"):
        outs = chat(squeezed_llm, CHATS, params_for())
        for i, (ours, ref) in enumerate(zip(outs, reference)):
            assert_same_greedy(ours.outputs.token_ids, ref.outputs.token_ids, top2_gaps(ref.outputs),
                               f"{attempt}, conversation {i}")
        if attempt == "prefix hits":
            assert all(o.num_cached_tokens > 0 for o in outs)
    assert preemptions[0] >= 2, f"only {preemptions[0]} preemptions"
    validate_json(outs[0].outputs.text, PERSON)
    assert re.fullmatch(IPV4, outs[1].outputs.text) and outs[2].outputs.text in ("red", "green", "blue")
    assert_engine_idle(squeezed_llm)
    assert squeezed_llm.llm_engine.structured_output.requests == {}


def test_processed_logprobs_see_the_mask_and_raw_ones_do_not(reference_llm, smollm_llm):
    choices = ["red", "green", "blue"]
    conv = [{"role": "user", "content": "Pick a color."}]
    constrained = SamplingParams(temperature=0, max_tokens=4, logprobs=20,
                                 guided_decoding=GuidedDecodingParams(choice=choices))
    processed = chat(reference_llm, [conv], constrained)[0].outputs.logprobs[0]
    tok = reference_llm.get_tokenizer()
    finite = {t: lp.logprob for t, lp in processed.items() if np.isfinite(lp.logprob)}
    assert finite, "no allowed token among the processed logprobs"
    for t in finite:  # only tokens that start one of the choices have a probability
        assert any(c.startswith(tok.decode([t])) and tok.decode([t]) for c in choices), tok.decode([t])
    assert np.isclose(sum(np.exp(v) for v in finite.values()), 1.0, atol=1e-3) or len(finite) == len(processed)
    # raw logprobs (smollm_llm's mode) are the model's own: equal to those of the free request
    raw = chat(smollm_llm, [conv], constrained)[0].outputs.logprobs[0]
    free = chat(smollm_llm, [conv], SamplingParams(temperature=0, max_tokens=1, logprobs=20))[0].outputs.logprobs[0]
    assert {t: round(lp.logprob, 4) for t, lp in free.items()} == \
        {t: round(lp.logprob, 4) for t, lp in raw.items() if t in free}


@pytest.fixture(scope="module")
def manager(smollm_llm):
    engine = smollm_llm.llm_engine
    return StructuredOutputManager("guidance", engine.tokenizer, engine.config.model_config.vocab_size,
                                   engine.eos_token_ids, reasoning=True)


def mask_of(manager, req_id):
    grammar = manager.grammar_bitmask([req_id])
    return None if grammar is None else allowed_tokens(grammar.bitmask(), manager.vocab_size)[0]


def test_eos_only_where_the_grammar_may_end(manager, tok):
    params = SamplingParams(guided_decoding=GuidedDecodingParams(regex="ab(cd)?"))
    manager.add_requests(["r"], params, tok.encode("<think>\n\n</think>\n\n", add_special_tokens=False))
    eos = tok.eos_token_id
    assert not mask_of(manager, "r")[eos]
    for t in tok.encode("ab", add_special_tokens=False):
        assert manager.accept_tokens({"r": [t]}) == {}
    allowed = mask_of(manager, "r")
    assert allowed[eos] and allowed.sum() > 1  # complete, or go on with "cd"
    for t in tok.encode("cd", add_special_tokens=False):
        assert manager.accept_tokens({"r": [t]}) == {}
    assert np.flatnonzero(mask_of(manager, "r")).tolist() == [eos]
    bad = tok.encode("x", add_special_tokens=False)[0]
    assert "not allowed" in manager.accept_tokens({"r": [bad]})["r"]
    manager.remove(["r"])


def test_the_constraint_starts_after_the_thinking(manager, tok):
    params = SamplingParams(guided_decoding=GuidedDecodingParams(regex="[0-9]+"))
    manager.add_requests(["open"], params, tok.encode("Question<think>", add_special_tokens=False))
    manager.add_requests(["closed"], params, tok.encode("<think>\n\n</think>\n\n", add_special_tokens=False))
    assert mask_of(manager, "open") is None  # thinking: no row, the request samples freely
    assert mask_of(manager, "closed") is not None
    for t in tok.encode("hmm, let me see</think>", add_special_tokens=False):
        assert manager.accept_tokens({"open": [t]}) == {}  # free text is not fed to the grammar
    allowed = mask_of(manager, "open")
    digits = [tok.encode(str(d), add_special_tokens=False)[0] for d in range(10)]
    assert allowed is not None and allowed[digits].all() and not allowed[tok.encode("a", add_special_tokens=False)[0]]
    manager.remove(["open", "closed"])


def test_reasoning_parser_end_to_end(tok):
    llm = LLM(max_model_len=512, block_size=16, reasoning_parser="qwen3")
    try:
        guided = GuidedDecodingParams(regex=IPV4)
        closed = "<|im_start|>user\nAn IP address?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        opened = "<|im_start|>user\nAn IP address?<|im_end|>\n<|im_start|>assistant\n<think>\n"
        outs = run(llm, [closed, opened, opened], [SamplingParams(temperature=0, max_tokens=40, guided_decoding=guided),
                                                   SamplingParams(temperature=0, max_tokens=40, guided_decoding=guided),
                                                   SamplingParams(temperature=0, max_tokens=40)])
        assert re.fullmatch(IPV4, outs[0].outputs.text)  # the prompt closed the thinking: constrained at once
        free = outs[2].outputs
        assert "</think>" not in tok.decode(free.token_ids)  # the model never closes it here, so ...
        assert outs[1].outputs.token_ids == free.token_ids  # ... the constraint never starts
    finally:
        llm.shutdown()
