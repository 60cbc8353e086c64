"""Bad input to the offline API: every case raises a clear error naming the problem, before any
work starts, nothing hangs, and the LLM keeps working afterwards. Uses the default model
(SmolLM2-135M-Instruct, vocabulary 49152, max_position_embeddings 8192)."""
from __future__ import annotations

import copy
import dataclasses
import signal

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.engine import LLMEngine

MAX_MODEL_LEN = 256
HANG_LIMIT_S = 120


@pytest.fixture(autouse=True)
def no_hang():
    """Fail (instead of hanging) when a test runs longer than HANG_LIMIT_S (or its own alarm)."""

    def on_alarm(signum, frame):
        raise TimeoutError("still running at its time limit: it hangs")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(HANG_LIMIT_S)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


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


@pytest.fixture
def no_loading(monkeypatch):
    """Make loading a model fail loudly: settings errors must come before it."""

    def refuse(cls, args):
        raise AssertionError("the model was being loaded although the arguments are invalid")

    monkeypatch.setattr(LLMEngine, "from_engine_args", classmethod(refuse))


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


# ---- sampling values (validated when SamplingParams is built) ----------------------------------
@pytest.mark.parametrize(
    "kwargs, error, field, shown",
    [
        ({"temperature": -1}, ValueError, "temperature", "-1"),
        ({"temperature": "hot"}, TypeError, "temperature", "'hot'"),
        ({"temperature": True}, TypeError, "temperature", "True"),
        ({"top_p": 0}, ValueError, "top_p", "got 0"),
        ({"top_p": 1.5}, ValueError, "top_p", "1.5"),
        ({"top_k": -2}, ValueError, "top_k", "-2"),
        ({"top_k": 1.5}, TypeError, "top_k", "1.5"),
        ({"max_tokens": 0}, ValueError, "max_tokens", "got 0"),
        ({"max_tokens": 2.0}, TypeError, "max_tokens", "2.0"),
        ({"min_tokens": 5, "max_tokens": 3}, ValueError, "min_tokens", "5"),
        ({"min_tokens": -1}, ValueError, "min_tokens", "-1"),
        ({"seed": -1}, ValueError, "seed", "-1"),
        ({"seed": 2**63}, ValueError, "seed", str(2**63)),
        ({"stop": [1]}, TypeError, "stop", "[1]"),
        ({"stop": ""}, ValueError, "stop", "''"),
        ({"stop_token_ids": [-1]}, TypeError, "stop_token_ids", "[-1]"),
        ({"n": 0}, ValueError, "n", "got 0"),
        ({"n": "2"}, TypeError, "n", "'2'"),
        ({"n": 2, "temperature": 0}, ValueError, "n", "n=2"),
        ({"temperature": float("nan")}, ValueError, "temperature", "nan"),
        ({"temperature": float("inf")}, ValueError, "temperature", "inf"),
        ({"presence_penalty": 2.5}, ValueError, "presence_penalty", "2.5"),
        ({"presence_penalty": -3}, ValueError, "presence_penalty", "-3"),
        ({"frequency_penalty": 3}, ValueError, "frequency_penalty", "got 3"),
        ({"frequency_penalty": "lots"}, TypeError, "frequency_penalty", "'lots'"),
        ({"repetition_penalty": 0}, ValueError, "repetition_penalty", "got 0"),
        ({"repetition_penalty": -1.2}, ValueError, "repetition_penalty", "-1.2"),
        ({"bad_words": "word"}, TypeError, "bad_words", "'word'"),
        ({"bad_words": [7]}, TypeError, "bad_words", "[7]"),
        ({"bad_words": ["ok", " "]}, ValueError, "bad_words", "' '"),
        ({"bad_words_token_ids": [-5]}, TypeError, "bad_words_token_ids", "[-5]"),
        ({"logprobs": -2}, ValueError, "logprobs", "-2"),
        ({"logprobs": 1.5}, TypeError, "logprobs", "1.5"),
        ({"prompt_logprobs": -3}, ValueError, "prompt_logprobs", "-3"),
        ({"ignore_eos": "yes"}, TypeError, "ignore_eos", "'yes'"),
        ({"include_stop_str_in_output": 1}, TypeError, "include_stop_str_in_output", "1"),
        ({"min_p": 2}, ValueError, "min_p", "2"),
        ({"min_p": -0.1}, ValueError, "min_p", "-0.1"),
    ],
    ids=lambda v: repr(v)[:30] if not isinstance(v, type) else v.__name__,
)
def test_invalid_sampling_values_name_the_field_and_value(kwargs, error, field, shown):
    with pytest.raises(error) as info:
        SamplingParams(**kwargs)
    message = str(info.value)
    assert message.startswith(f"{field} must "), message
    assert shown in message, message


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


@pytest.mark.parametrize(
    "kwargs, field",
    [({"max_logprobs": -2}, "max_logprobs"), ({"logprobs_mode": "raw_logits"}, "logprobs_mode"),
     ({"enable_logprob": "yes"}, "enable_logprob")],
)
def test_logprob_settings_are_checked_before_loading(no_loading, kwargs, field):
    with pytest.raises((ValueError, TypeError), match=rf"^{field} must"):
        LLM(**kwargs)


def test_min_tokens_message_names_max_tokens():
    with pytest.raises(ValueError, match=r"min_tokens must be <= max_tokens=3, got 5"):
        SamplingParams(min_tokens=5, max_tokens=3)


# ---- LLM(...) settings and model paths ---------------------------------------------------------
def test_unknown_keyword_raises_before_loading(no_loading):
    with pytest.raises(TypeError, match=r"unknown keyword argument\(s\) \['max_num_sequences'\]"):
        LLM(max_num_sequences=4)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_model_len": "256"}, "max_model_len"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"tensor_parallel_size": 2}, "tensor_parallel_size"),
        ({"max_num_seqs": 0}, "max_num_seqs"),
        ({"block_size": 0}, "block_size"),
        ({"num_gpu_blocks_override": 1}, "num_gpu_blocks_override"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens"),
        ({"kv_cache_ratio": 2}, "kv_cache_ratio"),
        ({"seed": -1}, "seed"),
    ],
    ids=lambda v: repr(v)[:40],
)
def test_invalid_settings_raise_before_loading(no_loading, kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field} must be"):
        LLM(**kwargs)


def test_max_model_len_above_the_models_context_is_rejected():
    with pytest.raises(ValueError, match=r"max_model_len=100000 exceeds the model's max_position_embeddings=8192"):
        LLM(max_model_len=100_000)


def test_budget_below_max_model_len_without_chunked_prefill_is_rejected():
    with pytest.raises(ValueError, match=r"max_num_batched_tokens=64 is below max_model_len=256"):
        LLM(max_model_len=256, max_num_batched_tokens=64)


def test_model_path_that_does_not_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=r"is not a local directory or file"):
        LLM(model=str(missing))


def test_directory_without_config_json(tmp_path):
    (tmp_path / "README.md").write_text("not a model")
    with pytest.raises(FileNotFoundError, match=r"has no config.json"):
        LLM(model=str(tmp_path))


def test_file_that_is_not_gguf(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match=r"is not a .gguf file"):
        LLM(model=str(path))


def test_name_not_in_the_hf_cache_is_not_downloaded(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(FileNotFoundError) as info:
        LLM(model="no-such-org/no-such-model-xyz")
    message = str(info.value)
    assert "does not download" in message
    assert "no-such-org/no-such-model-xyz" in message and str(tmp_path) in message


def test_model_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"model must be a path or a model name \(str\), got int"):
        LLM(model=5)


def test_pool_too_small_for_one_sequence_does_not_hang():
    """2 usable blocks of 16 tokens cannot hold one max_model_len=256 sequence: either LLM() says
    so, or generate() must end (an error or an output), not spin forever."""
    try:
        small = LLM(max_model_len=256, block_size=16, num_gpu_blocks_override=3)
    except ValueError as e:
        assert "num_gpu_blocks_override" in str(e) or "max_model_len" in str(e)
        return
    params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
    signal.alarm(30)  # 100 tokens of a 135M model take a few seconds
    try:
        out = small.generate([[100] * 10], params, use_tqdm=False)
    except ValueError as e:
        assert "block" in str(e) or "max_model_len" in str(e)
    else:
        assert len(out) == 1 and out[0].outputs.finish_reason is not None
    assert not small.llm_engine.has_unfinished_requests()


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
