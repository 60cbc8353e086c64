"""Fuzzing the prompt forms of `LLM.generate` and the messages of `LLM.chat` on the shared engine:
any input is accepted (and then every output is well formed) or rejected with ValueError/TypeError
before any work starts; after every example the engine is idle (no request left, every KV block
free) and a plain greedy request still gives the tokens it gave at the start."""
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fastdeploy import SamplingParams
from fastdeploy.engine.request import RequestOutput
from helpers import assert_engine_idle

MAX_TOKENS = 2
REFERENCE_PROMPT = "The capital of France is"  # < one block: no prefix-cache hit can change its run
FUZZ = settings(max_examples=50, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def weighted(*choices):
    """Draw from one of the (weight, strategy) choices with those odds (`|` would flatten nested one_ofs)."""
    bag = [strategy for weight, strategy in choices for _ in range(weight)]
    return st.integers(0, len(bag) - 1).flatmap(lambda i: bag[i])


def params() -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=MAX_TOKENS)


@pytest.fixture(scope="module")
def engine(smollm_llm):
    """(llm, vocab size, the reference prompt's greedy tokens before any fuzzing)."""
    vocab = smollm_llm.llm_engine.config.model_config.vocab_size
    assert_engine_idle(smollm_llm)
    reference = smollm_llm.generate(REFERENCE_PROMPT, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    return smollm_llm, vocab, reference[0].outputs.token_ids


def check_served_next(llm, reference) -> None:
    assert_engine_idle(llm)
    again = llm.generate(REFERENCE_PROMPT, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)
    assert again[0].outputs.token_ids == reference
    assert_engine_idle(llm)


def check_outputs(outputs, count: int, vocab: int) -> None:
    assert isinstance(outputs, list) and len(outputs) == count
    for out in outputs:
        assert isinstance(out, RequestOutput) and out.finished and out.error_code == 200
        assert out.prompt is None or isinstance(out.prompt, str)
        ids = out.prompt_token_ids
        assert ids and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids)
        assert len(out.outputs) == 1
        completion = out.outputs[0]
        assert 1 <= len(completion.token_ids) <= MAX_TOKENS
        assert all(isinstance(t, int) and 0 <= t < vocab for t in completion.token_ids)
        assert completion.finish_reason in ("stop", "length") and isinstance(completion.text, str)


def run_or_reject(call, count, vocab):
    """Outputs of an accepted call (checked), or None if it was rejected with ValueError/TypeError."""
    try:
        outputs = call()
    except (ValueError, TypeError) as e:
        event(f"rejected: {type(e).__name__}: {str(e)[:60]}")
        return None
    event("accepted")
    check_outputs(outputs, count, vocab)
    return outputs


# ---- generate -------------------------------------------------------------------------------------
VOCAB = 49152  # SmolLM2's; ids around it are drawn, and the engine's own vocab decides validity
token = st.one_of(
    st.integers(0, 300), st.integers(VOCAB - 3, VOCAB + 3), st.integers(-3, -1),
    st.integers(-(2**70), 2**70), st.booleans(), st.floats(allow_nan=True), st.none(), st.text(max_size=3),
)
edge_ids = st.lists(st.sampled_from([0, 1, VOCAB - 1, VOCAB, VOCAB + 1, -1, 2**63, -(2**63), 2**70])
                    | st.integers(0, 2000), min_size=1, max_size=5)  # ints only: the vocabulary check decides
ids = st.lists(st.integers(0, 2000), min_size=0, max_size=8) | edge_ids | st.lists(token, max_size=6)
text = st.text(max_size=30) | st.sampled_from(["", " ", "\n", "Hello", "<|im_end|>", "\x00", "é" * 5])
junk = st.none() | st.integers() | st.floats() | st.booleans() | st.binary(max_size=4)
prompt_dict = st.dictionaries(
    st.sampled_from(["prompt", "prompt_token_ids", "multimodal_data", "extra", ""]),
    text | ids | junk | st.lists(ids, max_size=2) | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    max_size=3,
)
valid_ids = st.lists(st.integers(0, 2000), min_size=1, max_size=8)
valid_prompt = st.one_of(
    text, valid_ids, st.fixed_dictionaries({"prompt": text}), st.fixed_dictionaries({"prompt_token_ids": valid_ids}),
    st.fixed_dictionaries({"prompt": text, "prompt_token_ids": valid_ids}),
)
one_prompt = valid_prompt | text | ids | prompt_dict | junk
prompts = weighted(
    (3, valid_prompt),
    (2, one_prompt),
    (3, st.lists(valid_prompt, min_size=1, max_size=3)),
    (2, st.lists(one_prompt, max_size=3)),
    (1, st.tuples(valid_prompt, one_prompt)),
    (1, edge_ids),
    (1, st.fixed_dictionaries({"prompt_token_ids": edge_ids})),
    (1, st.lists(st.lists(ids, max_size=2), max_size=2)),  # nested too deep
    (1, st.sampled_from([[[]], [""], {}, [], (), [[1, 2], []], [{"prompt": "a"}, 3], None])),
    (1, st.lists(st.integers(0, 2000), min_size=1020, max_size=1030)),  # about max_model_len (1024)
)


def expected_count(p) -> int:
    if isinstance(p, (str, dict)):
        return 1
    if isinstance(p, (list, tuple)) and p and isinstance(p[0], int) and not isinstance(p[0], bool):
        return 1
    return len(p) if isinstance(p, (list, tuple)) else 1


@FUZZ
@given(prompts)
def test_generate_accepts_or_rejects_any_prompt_and_serves_the_next(engine, p):
    llm, vocab, reference = engine
    run_or_reject(lambda: llm.generate(p, params(), use_tqdm=False), expected_count(p), vocab)
    check_served_next(llm, reference)


# ---- chat -----------------------------------------------------------------------------------------
part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}),
    st.fixed_dictionaries({"type": st.sampled_from(["image_url", "audio", "", "TEXT"]), "text": text}),
    st.fixed_dictionaries({"type": st.just("text"), "text": junk}),
    st.fixed_dictionaries({"type": st.just("text")}),
    text, junk,
)
content = text | junk | st.lists(part, max_size=3) | st.dictionaries(st.text(max_size=3), text, max_size=2)
role = st.sampled_from(["system", "user", "assistant", "tool", "developer", "", "USER", "bot"]) | junk
message = st.one_of(
    st.fixed_dictionaries({"role": role, "content": content},
                          optional={"name": text | junk, "tool_calls": st.lists(junk, max_size=2),
                                    "reasoning_content": text | junk}),
    st.fixed_dictionaries({"role": role}),
    st.fixed_dictionaries({"content": content}),
    text, junk, st.lists(text, max_size=2),
)
valid_message = st.fixed_dictionaries({
    "role": st.sampled_from(["system", "user", "assistant", "user"]),
    "content": text | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text}), min_size=1, max_size=2),
})
any_message = valid_message | valid_message | message
conversation = st.lists(any_message, max_size=4) | st.lists(valid_message, min_size=1, max_size=3)
messages = weighted(
    (4, conversation),
    (2, st.lists(conversation, max_size=3)),  # a batch
    (2, st.lists(st.lists(valid_message, min_size=1, max_size=2), min_size=1, max_size=3)),
    (1, st.lists(st.lists(conversation, max_size=2), max_size=2)),  # nested too deep
    (1, message),
    (1, st.sampled_from([[], [[]], {}, None, "hi"])),
)
kwargs_dict = st.dictionaries(
    st.sampled_from(["enable_thinking", "tokenize", "return_dict", "add_generation_prompt", "continue_final_message",
                     "tools", "documents", "conversation", "chat_template", "x"]),
    junk | text | st.lists(junk, max_size=2), max_size=2)
template_kwargs = weighted((5, st.none()), (3, kwargs_dict), (1, junk))


def chat_count(m) -> int:
    if isinstance(m, list) and m and isinstance(m[0], dict):
        return 1
    return len(m) if isinstance(m, list) else 1


@FUZZ
@given(messages, template_kwargs)
def test_chat_accepts_or_rejects_any_messages_and_serves_the_next(engine, m, kwargs):
    llm, vocab, reference = engine
    run_or_reject(lambda: llm.chat(m, params(), use_tqdm=False, chat_template_kwargs=kwargs), chat_count(m), vocab)
    check_served_next(llm, reference)


# ---- regressions found by the fuzz tests above ----------------------------------------------------
@pytest.mark.parametrize("ids", ["abc", {"prompt": "x"}, 5, 1.0, b"\x01"])
def test_prompt_token_ids_that_are_not_a_list_are_rejected(engine, ids):
    """{"prompt_token_ids": "abc"} was tokenized as text, and a dict there was read as a prompt dict."""
    llm, _, reference = engine
    for prompt in ({"prompt_token_ids": ids}, {"prompt": "x", "prompt_token_ids": ids}):
        with pytest.raises(TypeError, match=r"prompt 0: 'prompt_token_ids' must be a list of ints"):
            llm.generate(prompt, params(), use_tqdm=False)
    check_served_next(llm, reference)


@pytest.mark.parametrize("key", ["tokenize", "add_generation_prompt", "chat_template", "conversation"])
def test_chat_template_kwargs_may_not_set_the_render_arguments(engine, key):
    """They reached apply_chat_template twice: a TypeError that named neither chat_template_kwargs nor chat."""
    llm, _, reference = engine
    with pytest.raises(ValueError, match=f"chat_template_kwargs must not set '{key}'"):
        llm.chat([{"role": "user", "content": "hi"}], params(), use_tqdm=False, chat_template_kwargs={key: True})
    with pytest.raises(TypeError, match="chat_template_kwargs keys must be str"):
        llm.chat([{"role": "user", "content": "hi"}], params(), use_tqdm=False, chat_template_kwargs={1: True})
    check_served_next(llm, reference)


@pytest.mark.parametrize("name,value", [("temperature", 10**400), ("temperature", "hot"), ("temperature", True),
                                        ("top_k", 1.7), ("top_p", [1]), ("max_tokens", "5")])
def test_sampling_params_edited_after_construction_are_checked_again(engine, name, value):
    """Found while fuzzing: float()/int()/min() of an edited field raised OverflowError or errors naming
    no field (or truncated top_k=1.7 to 1) instead of the field's own ValueError/TypeError."""
    llm, _, reference = engine
    p = params()
    setattr(p, name, value)
    with pytest.raises((ValueError, TypeError), match=f"^{name} must be"):
        llm.generate("Hi", p, use_tqdm=False)
    assert getattr(p, name) == value
    check_served_next(llm, reference)
