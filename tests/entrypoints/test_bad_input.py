"""Bad input to the offline API: every case raises a clear error naming the problem, before any
work starts, nothing hangs, and the LLM keeps working afterwards. Uses the default model
(SmolLM2-135M-Instruct, vocabulary 49152, max_position_embeddings 8192)."""
from __future__ import annotations

import copy
import dataclasses

import pytest

from fastdeploy import LLM, SamplingParams

MAX_MODEL_LEN = 256


pytestmark = pytest.mark.usefixtures("no_hang")


@pytest.fixture(scope="module")
def llm():
    return LLM(max_model_len=MAX_MODEL_LEN, max_num_seqs=4)


@pytest.fixture(autouse=True)
def isolate(request):
    """Each test starts from, and (even when it fails) leaves, an engine with nothing queued."""
    if "llm" not in request.fixturenames:
        yield
        return
    engine = request.getfixturevalue("llm").llm_engine
    yield
    for request_id in list(engine.output_processor.groups):
        engine.abort_request(request_id)


def assert_idle(llm):
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests()
    assert engine.output_processor.groups == {}
    assert engine.block_pool.num_free_blocks == engine.block_pool.num_usable_blocks


def assert_still_works(llm):
    out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out) == 1
    completion = out[0].outputs
    assert 1 <= len(completion.token_ids) <= 4
    if len(completion.token_ids) == 4 and completion.token_ids[-1] not in llm.llm_engine.eos_token_ids:
        assert completion.finish_reason == "length"
    else:
        assert completion.finish_reason == "stop"
        assert completion.token_ids[-1] in llm.llm_engine.eos_token_ids
    assert_idle(llm)


# ---- prompts -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "prompt, error, match",
    [
        ("", ValueError, r"prompt is empty"),
        ([[]], ValueError, r"prompt is empty"),
        ({"prompt": ""}, ValueError, r"prompt is empty"),
        ([], ValueError, r"prompts must be a non-empty"),
        ({"prompt_token_ids": []}, ValueError, r"needs a 'prompt' str or 'prompt_token_ids'"),
        (None, ValueError, r"prompts must be given"),
        ([10**6], ValueError, r"prompt token id 1000000 .*outside the vocabulary \[0, 49152\)"),
        ([1, 2, -1], ValueError, r"prompt token id -1 .*outside the vocabulary"),
        ([49152], ValueError, r"prompt token id 49152 .*outside the vocabulary \[0, 49152\)"),
        ({"prompt_token_ids": [5, 10**6]}, ValueError, r"prompt token id 1000000 .*outside the vocabulary"),
        ([1, 2.5], TypeError, r"token-id prompt must be a list of ints"),
        ([1, "a"], TypeError, r"token-id prompt must be a list of ints"),
        ([3.5], TypeError, r"prompt 0 has type float"),
        ({"text": "hi"}, ValueError, r"unknown key\(s\) \['text'\]"),
        (12, ValueError, r"prompts must be a non-empty str, list or dict"),
    ],
    ids=lambda v: repr(v)[:30] if not isinstance(v, type) else v.__name__,
)
def test_bad_prompt_raises_naming_the_problem(llm, prompt, error, match):
    with pytest.raises(error, match=match):
        llm.generate(prompt, SamplingParams(max_tokens=2), use_tqdm=False)
    assert_idle(llm)


@pytest.mark.parametrize("length", [MAX_MODEL_LEN, MAX_MODEL_LEN + 1, 1000])
def test_prompt_that_leaves_no_room_is_rejected(llm, length):
    with pytest.raises(ValueError, match=rf"prompt has {length} tokens.*max_model_len={MAX_MODEL_LEN}"):
        llm.generate([[100] * length], use_tqdm=False)
    assert_idle(llm)


def test_long_text_prompt_is_rejected(llm):
    with pytest.raises(ValueError, match=rf"max_model_len={MAX_MODEL_LEN}"):
        llm.generate("hello " * 400, use_tqdm=False)
    assert_idle(llm)


def test_prompt_one_token_short_of_max_model_len_generates_one_token(llm):
    out = llm.generate([[100] * (MAX_MODEL_LEN - 1)], SamplingParams(temperature=0, max_tokens=50), use_tqdm=False)
    completion = out[0].outputs
    assert len(completion.token_ids) == 1
    eos = completion.token_ids[0] in llm.llm_engine.eos_token_ids
    assert completion.finish_reason == ("stop" if eos else "length")
    assert_idle(llm)


@pytest.mark.parametrize("count", [0, 1, 3])
def test_sampling_params_list_of_the_wrong_length(llm, count):
    with pytest.raises(ValueError, match=rf"same length: 2 prompts, {count} sampling_params"):
        llm.generate(["a", "b"], [SamplingParams(max_tokens=1)] * count, use_tqdm=False)
    assert_idle(llm)


def test_sampling_params_of_the_wrong_type(llm):
    with pytest.raises(TypeError, match=r"sampling_params\[1\] must be a SamplingParams, got dict"):
        llm.generate(["a", "b"], [SamplingParams(max_tokens=1), {"temperature": 0}], use_tqdm=False)
    with pytest.raises(TypeError, match=r"sampling_params must be a SamplingParams or a list"):
        llm.generate("a", {"temperature": 0}, use_tqdm=False)
    assert_idle(llm)


# ---- a bad item in a batch ---------------------------------------------------------------------
def _mutated_params():
    params = SamplingParams(max_tokens=2)
    params.top_p = 5.0  # made invalid after construction: dataclasses do not re-validate
    return params


@pytest.mark.parametrize(
    "prompts, params, error, match",
    [
        (["Hello", [10**6]], None, ValueError, r"outside the vocabulary"),
        (["Hello", "world", ""], None, ValueError, r"prompt is empty \(prompt 2\)"),
        (["Hello", [7] * 300], None, ValueError, r"prompt has 300 tokens \(prompt 1\)"),
        (["Hello", 3.5], None, TypeError, r"prompt 1 has type float"),
        (["Hello", "world"], [SamplingParams(max_tokens=2), "x"], TypeError, r"sampling_params\[1\]"),
        (["Hello", "world"], [SamplingParams(max_tokens=2), _mutated_params()], ValueError, r"top_p"),
    ],
    ids=["bad-id", "empty", "too-long", "bad-type", "bad-params-type", "params-mutated-invalid"],
)
def test_bad_item_in_a_batch_raises_before_any_work(llm, prompts, params, error, match):
    with pytest.raises(error, match=match):
        llm.generate(prompts, params, use_tqdm=False)
    assert_idle(llm)  # nothing of the good items was queued or left behind
    assert_still_works(llm)


def test_bad_conversation_in_a_chat_batch_raises_before_any_work(llm):
    good = [{"role": "user", "content": "Hi"}]
    with pytest.raises(ValueError, match=r"conversation 1, message 0: 'role' must be one of"):
        llm.chat([good, [{"role": "robot", "content": "Hi"}]], SamplingParams(max_tokens=2), use_tqdm=False)
    assert_idle(llm)


def test_llm_still_works_after_failing_calls(llm):
    failing = [
        lambda: llm.generate("", use_tqdm=False),
        lambda: llm.generate([10**6], use_tqdm=False),
        lambda: llm.generate([[1] * 1000], use_tqdm=False),
        lambda: llm.chat([{"role": "robot", "content": "x"}], use_tqdm=False),
        lambda: llm.generate(["a", "b"], [SamplingParams()], use_tqdm=False),
    ]
    for call in failing:
        with pytest.raises((ValueError, TypeError)):
            call()
        assert_still_works(llm)


# ---- chat messages -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "messages, error, match",
    [
        ("Hello", ValueError, r"messages must be a non-empty list"),
        ({"role": "user", "content": "Hi"}, ValueError, r"messages must be a non-empty list"),
        ([], ValueError, r"messages must be a non-empty list"),
        ([[]], ValueError, r"conversation 0 must be a non-empty list of message dicts"),
        ([{"role": "user", "content": "Hi"}, "oops"], TypeError, r"conversation 0, message 1 must be a dict"),
        ([["Hello"]], TypeError, r"conversation 0, message 0 must be a dict"),
        (["Hello"], ValueError, r"conversation 0 must be a non-empty list of message dicts"),
        ([{"role": "robot", "content": "Hi"}], ValueError, r"'role' must be one of .*got 'robot'"),
        ([{"content": "Hi"}], ValueError, r"'role' must be one of .*got None"),
        ([{"role": "user", "content": 123}], TypeError, r"'content' must be a str .*got int"),
        ([{"role": "user"}], TypeError, r"'content' must be a str .*got NoneType"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], ValueError, r"content parts"),
        ([{"role": "user", "content": ["Hi"]}], ValueError, r"content parts"),
    ],
    ids=lambda v: repr(v)[:40] if not isinstance(v, type) else v.__name__,
)
def test_malformed_chat_messages(llm, messages, error, match):
    with pytest.raises(error, match=match):
        llm.chat(messages, SamplingParams(max_tokens=2), use_tqdm=False)
    assert_idle(llm)


def test_chat_template_kwargs_must_be_a_dict(llm):
    with pytest.raises(TypeError, match=r"chat_template_kwargs must be a dict, got str"):
        llm.chat([{"role": "user", "content": "Hi"}], chat_template_kwargs="enable_thinking", use_tqdm=False)
    assert_idle(llm)


def test_chat_longer_than_max_model_len(llm):
    with pytest.raises(ValueError, match=rf"max_model_len={MAX_MODEL_LEN}"):
        llm.chat([{"role": "user", "content": "word " * 400}], use_tqdm=False)
    assert_idle(llm)


# ---- sampling values checked against the model ------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, field, shown",
    [
        ({"logprobs": 21}, "logprobs", "max_logprobs=20"),
        ({"prompt_logprobs": 50}, "prompt_logprobs", "max_logprobs=20"),
        ({"logprobs": -1}, "logprobs", "max_logprobs=20"),
        ({"stop_token_ids": [10**7]}, "stop_token_ids", "10000000"),
        ({"bad_words_token_ids": [10**7]}, "bad_words_token_ids", "10000000"),
    ],
)
def test_values_checked_against_the_model_name_the_field(llm, kwargs, field, shown):
    with pytest.raises(ValueError) as info:
        llm.generate(["fine", "also fine"], SamplingParams(max_tokens=2, **kwargs), use_tqdm=False)
    message = str(info.value)
    assert message.startswith(f"{field}") and shown in message, message
    assert_idle(llm)


def test_logprobs_need_enable_logprob_when_it_is_off(llm, monkeypatch):
    monkeypatch.setattr(llm.llm_engine.config, "max_logprobs", None)  # as LLM(enable_logprob=False)
    with pytest.raises(ValueError, match=r"^logprobs=1 was requested, but .*enable_logprob=False"):
        llm.generate("hi", SamplingParams(max_tokens=2, logprobs=1), use_tqdm=False)
    assert_idle(llm)


# ---- the caller's objects are not modified -----------------------------------------------------
def test_generate_does_not_mutate_sampling_params_or_prompt_dicts(llm):
    params = SamplingParams(temperature=0, max_tokens=3, stop=["zzzz"], stop_token_ids=[49151])
    shared = SamplingParams(max_tokens=2, seed=7)  # top_p/top_k/temperature left None
    params_before, shared_before = dataclasses.asdict(params), dataclasses.asdict(shared)
    prompts = [
        {"prompt": "Hello there"},
        {"prompt": "ignored text", "prompt_token_ids": [504, 3458, 28]},
        [504, 3458, 28],
    ]
    prompts_before = copy.deepcopy(prompts)
    params_list = [params, shared, shared]
    llm.generate(prompts, params_list, use_tqdm=False)
    llm.generate(prompts[0], shared, use_tqdm=False)
    assert dataclasses.asdict(params) == params_before
    assert dataclasses.asdict(shared) == shared_before
    assert shared.temperature is None and shared.top_p is None and shared.top_k is None
    assert prompts == prompts_before
    assert params_list == [params, shared, shared] and len(params_list) == 3
    assert_idle(llm)


def test_chat_does_not_mutate_messages(llm):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": " there"}]},
    ]
    before = copy.deepcopy(messages)
    params = SamplingParams(temperature=0, max_tokens=2)
    params_before = dataclasses.asdict(params)
    out = llm.chat(messages, params, use_tqdm=False)
    assert len(out) == 1
    assert messages == before
    assert dataclasses.asdict(params) == params_before
    assert_idle(llm)
