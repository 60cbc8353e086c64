"""Regression tests for defects found in code review (each failed before its fix).

1. concurrent generate/chat on one LLM: serialised, never hangs, same outputs as one thread;
2. chat_template: a missing file, a Jinja syntax error or the template's raise_exception give
   FileNotFoundError/ValueError naming `chat_template`;
3. LLM() configures only the "fastdeploy" logger, once;
4. 0 < temperature < 1e-5 is greedy (vLLM's _SAMPLING_EPS rule), never NaN/overflow;
5. max_num_batched_tokens < max_num_seqs is rejected before loading.
Oracles: the single-threaded greedy run, temperature=0 runs, the messages' required content.
"""
from __future__ import annotations

import logging
import math
import threading
from types import SimpleNamespace

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.engine import LLMEngine

HANG_LIMIT_S = 240
JOIN_TIMEOUT_S = 180
MESSAGES = [{"role": "user", "content": "Hi"}]


pytestmark = pytest.mark.usefixtures("no_hang")  # with this module's HANG_LIMIT_S


@pytest.fixture
def stub_engine(monkeypatch):
    """LLM() without loading a model: the engine is a stub with a tokenizer-less shell."""
    monkeypatch.setattr(LLMEngine, "from_engine_args", classmethod(lambda cls, args: SimpleNamespace()))


# ---- 1. concurrent calls -------------------------------------------------------------------------
def _greedy_ids(outputs):
    return [o.outputs.token_ids for o in outputs]


def test_two_threads_sharing_one_llm_both_finish_with_single_thread_results(smollm_llm):
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    work = {
        "a": (lambda: smollm_llm.generate(["The capital of France is", "1, 2, 3,"], params, use_tqdm=False)),
        "b": (lambda: smollm_llm.chat([MESSAGES, [{"role": "user", "content": "Name a colour"}]], params,
                                      use_tqdm=False)),
    }
    expected = {name: _greedy_ids(call()) for name, call in work.items()}  # one thread, one call at a time
    results, errors = {}, {}

    def run(name):
        try:
            results[name] = [_greedy_ids(work[name]()) for _ in range(2)]
        except BaseException as e:  # reported below, never lost in the thread
            errors[name] = e

    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a concurrent generate/chat call hangs"
    assert errors == {}
    assert results == {name: [ids, ids] for name, ids in expected.items()}
    assert not smollm_llm.llm_engine.has_unfinished_requests()


def test_a_call_made_while_another_runs_waits_for_it(smollm_llm, monkeypatch):
    """The second caller blocks until the first returns (serialised, not interleaved)."""
    engine = smollm_llm.llm_engine
    entered, release, order = threading.Event(), threading.Event(), []
    original_step = engine.step

    def slow_step():
        if threading.current_thread().name == "first" and not entered.is_set():
            entered.set()
            release.wait(JOIN_TIMEOUT_S)
        return original_step()

    monkeypatch.setattr(engine, "step", slow_step)
    params = SamplingParams(temperature=0, max_tokens=2)
    call = lambda name: (smollm_llm.generate("Hello", params, use_tqdm=False), order.append(name))  # noqa: E731
    first = threading.Thread(target=call, args=("first",), name="first", daemon=True)
    second = threading.Thread(target=call, args=("second",), name="second", daemon=True)
    first.start()
    assert entered.wait(JOIN_TIMEOUT_S)
    second.start()
    second.join(1.0)
    assert second.is_alive() and order == []  # waiting for the first call
    release.set()
    first.join(JOIN_TIMEOUT_S)
    second.join(JOIN_TIMEOUT_S)
    assert not first.is_alive() and not second.is_alive()
    assert order == ["first", "second"]


def test_a_call_from_inside_a_call_on_the_same_thread_raises_instead_of_deadlocking(smollm_llm, monkeypatch):
    engine = smollm_llm.llm_engine
    original_step = engine.step

    def reentrant_step():
        smollm_llm.generate("again", SamplingParams(max_tokens=1), use_tqdm=False)
        return original_step()

    monkeypatch.setattr(engine, "step", reentrant_step)
    with pytest.raises(RuntimeError, match=r"LLM.generate was called while this thread is inside another call"):
        smollm_llm.generate("Hello", SamplingParams(max_tokens=2), use_tqdm=False)
    monkeypatch.setattr(engine, "step", original_step)
    assert not engine.has_unfinished_requests() and engine.output_processor.groups == {}
    assert len(smollm_llm.generate("Hello", SamplingParams(max_tokens=2), use_tqdm=False)) == 1


# ---- 2. chat templates ---------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["my.jinja", "templates/chat.j2", "chat.jinja2", "dir/template"])
def test_missing_template_file_is_file_not_found(stub_engine, tmp_path, name):
    path = str(tmp_path / name)
    with pytest.raises(FileNotFoundError, match=r"chat_template") as info:
        LLM(chat_template=path)
    assert path in str(info.value)


def test_missing_template_file_in_chat_call(smollm_llm, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"chat_template"):
        smollm_llm.chat(MESSAGES, chat_template=str(tmp_path / "my.jinja"), use_tqdm=False)


def test_existing_template_file_is_read(smollm_llm, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}", encoding="utf-8")
    out = smollm_llm.chat(MESSAGES, SamplingParams(max_tokens=1), chat_template=str(path), use_tqdm=False)
    assert out[0].prompt == "[Hi]"


BAD_SYNTAX = "{% for m in messages %}\n{{ m['content'] }\n{% endfor %}"  # '}' instead of '}}' on line 2


def test_syntax_error_in_llm_template_is_value_error_with_line(stub_engine):
    with pytest.raises(ValueError, match=r"chat_template.*syntax.*line 2"):
        LLM(chat_template=BAD_SYNTAX)


def test_syntax_error_in_chat_call_template_is_value_error_with_line(smollm_llm):
    with pytest.raises(ValueError, match=r"chat_template.*syntax.*line 2"):
        smollm_llm.chat(MESSAGES, chat_template=BAD_SYNTAX, use_tqdm=False)


RAISING = "{% if messages[0]['role'] == 'user' %}{{ raise_exception('Only system messages first!') }}{% endif %}"


def test_raise_exception_in_chat_call_template_is_value_error(smollm_llm):
    with pytest.raises(ValueError, match=r"chat_template.*Only system messages first!"):
        smollm_llm.chat(MESSAGES, chat_template=RAISING, use_tqdm=False)
    assert not smollm_llm.llm_engine.has_unfinished_requests()


def test_raise_exception_in_the_models_own_template_is_value_error(smollm_llm, monkeypatch):
    monkeypatch.setattr(smollm_llm.get_tokenizer(), "chat_template", RAISING)
    with pytest.raises(ValueError, match=r"chat_template.*Only system messages first!"):
        smollm_llm.chat(MESSAGES, use_tqdm=False)


# ---- 3. logging ------------------------------------------------------------------------------------
def test_llm_leaves_the_root_logger_alone_and_adds_one_handler(stub_engine, monkeypatch):
    root, ours = logging.getLogger(), logging.getLogger("fastdeploy")
    monkeypatch.setattr(root, "handlers", [])  # as in a script that configured nothing
    monkeypatch.setattr(ours, "handlers", [])
    root_level = root.level
    LLM()
    LLM()
    assert root.handlers == [] and root.level == root_level
    assert len(ours.handlers) == 1
    assert ours.getEffectiveLevel() <= logging.INFO


def test_records_reach_the_applications_root_handler_once(stub_engine, monkeypatch):
    """With the application's own root handler, it gets each record and ours stays silent."""
    seen, printed = [], []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    monkeypatch.setattr(logging.getLogger(), "handlers", [Collect()])
    LLM()
    for handler in logging.getLogger("fastdeploy").handlers:
        monkeypatch.setattr(handler, "stream", SimpleNamespace(write=printed.append, flush=lambda: None))
    logging.getLogger("fastdeploy.test").info("one record")
    assert seen == ["one record"] and printed == []


# ---- 4. tiny temperatures --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def processed_llm():
    """Logprobs after temperature: where a tiny temperature showed as huge or NaN values."""
    return LLM(max_model_len=256, max_num_seqs=4, logprobs_mode="processed_logprobs")


def _logprob_values(out):
    return [{t: lp.logprob for t, lp in step.items()} for step in out.outputs.logprobs]


@pytest.mark.parametrize("temperature", [1e-6, 1e-45, 9.99e-6])
def test_tiny_temperature_is_greedy(processed_llm, temperature):
    prompts = ["The capital of France is", "Once upon a time"]
    greedy = processed_llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, logprobs=2), use_tqdm=False)
    tiny = processed_llm.generate(prompts, SamplingParams(temperature=temperature, max_tokens=8, logprobs=2),
                                  use_tqdm=False)
    assert _greedy_ids(tiny) == _greedy_ids(greedy)
    for out, ref in zip(tiny, greedy):
        values = _logprob_values(out)
        assert all(math.isfinite(v) for step in values for v in step.values())
        for step, ref_step in zip(values, _logprob_values(ref)):
            assert step.keys() == ref_step.keys()
            assert all(math.isclose(step[t], ref_step[t], rel_tol=1e-5, abs_tol=1e-5) for t in step)


def test_tiny_temperature_resolves_to_zero_for_the_sampler(smollm_llm):
    resolved = smollm_llm.llm_engine.input_processor.resolve_sampling_params(SamplingParams(temperature=1e-6), 4)
    assert resolved.temperature == 0.0


def test_temperature_at_the_threshold_still_samples():
    assert SamplingParams(temperature=1e-5).temperature == 1e-5


def test_tiny_temperature_with_n_above_one_is_rejected_as_greedy():
    with pytest.raises(ValueError, match=r"^n must be 1 with greedy decoding.*temperature=1e-06"):
        SamplingParams(temperature=1e-6, n=2)


# ---- 5. token budget below the sequence limit -----------------------------------------------------
def test_budget_below_max_num_seqs_is_rejected_before_loading(stub_engine):
    with pytest.raises(ValueError, match=r"^max_num_batched_tokens=8 .*max_num_seqs=16") as info:
        LLM(max_num_seqs=16, max_num_batched_tokens=8, enable_chunked_prefill=True, max_model_len=64)
    assert "raise max_num_batched_tokens" in str(info.value) and "lower max_num_seqs" in str(info.value)


def test_default_budget_below_max_num_seqs_is_rejected(stub_engine):
    with pytest.raises(ValueError, match=r"max_num_batched_tokens=2048 .*max_num_seqs=4096"):
        LLM(max_num_seqs=4096, enable_chunked_prefill=True)


def test_budget_equal_to_max_num_seqs_is_accepted(stub_engine):
    LLM(max_num_seqs=16, max_num_batched_tokens=16, enable_chunked_prefill=True, max_model_len=64)
