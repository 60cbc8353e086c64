"""LLM.generate / LLM.chat input forms, output order and output fields, on the default model."""
import copy
import dataclasses

from fastdeploy import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8)


def _tokens(outputs):
    return [o.outputs.token_ids for o in outputs]


def test_every_prompt_form_gives_the_same_tokens(smollm_llm):
    text = "The three primary colors are"
    ids = smollm_llm.get_tokenizer().encode(text, add_special_tokens=False)
    forms = [
        text,
        [text],
        ids,
        [ids],
        {"prompt": text},
        {"prompt_token_ids": ids},
        {"prompt": "ignored when ids are given", "prompt_token_ids": ids},
        [{"prompt": text}],
        [{"prompt_token_ids": ids}],
    ]
    results = [smollm_llm.generate(form, GREEDY, use_tqdm=False) for form in forms]
    for outputs in results:
        assert len(outputs) == 1
        assert outputs[0].prompt_token_ids == ids
        assert outputs[0].outputs.token_ids == results[0][0].outputs.token_ids
    assert results[0][0].prompt == text
    assert len(results[0][0].outputs.token_ids) == 8


def test_batch_of_very_different_lengths_comes_back_in_input_order(smollm_llm):
    prompts = ["Hi", "Tell me a long story about " + "a dragon and a knight, " * 60, "1 2 3", "Why?" * 20]
    params = [SamplingParams(temperature=0, max_tokens=n) for n in (5, 9, 3, 7)]
    batched = smollm_llm.generate(prompts, params, use_tqdm=False)
    alone = [smollm_llm.generate(p, sp, use_tqdm=False)[0] for p, sp in zip(prompts, params)]
    assert [o.prompt for o in batched] == prompts
    assert _tokens(batched) == _tokens(alone)
    assert [len(o.outputs.token_ids) for o in batched] == [5, 9, 3, 7]


def test_output_fields_are_filled(smollm_llm):
    out = smollm_llm.generate("Paris is", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert out.finished is True
    assert out.outputs.finish_reason in ("stop", "length")
    assert out.outputs.text == smollm_llm.get_tokenizer().decode(out.outputs.token_ids, skip_special_tokens=True)
    m = out.metrics
    assert m.arrival_time <= m.inference_start_time
    assert 0 <= m.time_in_queue and 0 < m.first_token_time <= m.model_forward_time <= m.model_execute_time
    assert out.error_code == 200 and out.error_msg is None


def test_chat_single_conversation_and_batch(smollm_llm):
    conv = [{"role": "user", "content": "Name a fruit."}]
    single = smollm_llm.chat(conv, GREEDY, use_tqdm=False)
    batch = smollm_llm.chat([conv, [{"role": "user", "content": "Name a color."}]], GREEDY, use_tqdm=False)
    assert len(single) == 1 and len(batch) == 2
    assert single[0].outputs.token_ids == batch[0].outputs.token_ids
    assert single[0].outputs.token_ids != batch[1].outputs.token_ids


def test_chat_template_and_kwargs_reach_the_template(smollm_llm):
    template = "{% if enable_thinking %}THINK {% else %}NOTHINK {% endif %}{{ messages[-1]['content'] }}"
    conv = [{"role": "user", "content": "hello"}]
    on = smollm_llm.chat(conv, GREEDY, use_tqdm=False, chat_template=template,
                         chat_template_kwargs={"enable_thinking": True})
    off = smollm_llm.chat(conv, GREEDY, use_tqdm=False, chat_template=template,
                          chat_template_kwargs={"enable_thinking": False})
    assert on[0].prompt == "THINK hello" and off[0].prompt == "NOTHINK hello"


def test_use_tqdm_false_prints_nothing_and_true_shows_speeds(smollm_llm, capsys):
    smollm_llm.generate("Hello", GREEDY, use_tqdm=False)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    smollm_llm.generate("Hello", GREEDY, use_tqdm=True)
    err = capsys.readouterr().err
    assert "Processed prompts" in err and "toks/s" in err and "output:" in err


def test_callers_params_and_dicts_are_not_mutated(smollm_llm):
    """max_tokens beyond the room left is clamped on the engine's copy, never on the caller's object."""
    params = SamplingParams(temperature=0, max_tokens=5000, stop=["\n\n"])
    room = 8
    ids = smollm_llm.get_tokenizer().encode("one two three " * 400, add_special_tokens=False)[: 1024 - room]
    prompt = {"prompt_token_ids": ids}
    before_params, before_prompt = dataclasses.asdict(params), copy.deepcopy(prompt)
    outputs = smollm_llm.generate([prompt, prompt], params, use_tqdm=False)
    assert all(len(o.outputs.token_ids) <= room for o in outputs)
    assert dataclasses.asdict(params) == before_params
    assert prompt == before_prompt


def test_stop_strings_and_stop_token_ids(smollm_llm):
    base = smollm_llm.generate("Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]
    text, ids = base.outputs.text, base.outputs.token_ids
    stop = text[3:6]
    cut = smollm_llm.generate("Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=12, stop=[stop]),
                              use_tqdm=False)[0]
    assert cut.outputs.text == text[: text.index(stop)]
    assert cut.outputs.finish_reason == "stop" and cut.outputs.stop_reason == stop
    by_id = smollm_llm.generate("Count: 1, 2, 3,", SamplingParams(temperature=0, max_tokens=12,
                                stop_token_ids=[ids[4]]), use_tqdm=False)[0]
    assert by_id.outputs.token_ids == ids[: ids.index(ids[4]) + 1]
    assert by_id.outputs.stop_reason == ids[4]


def test_min_tokens_masks_eos(smollm_llm):
    conv = [{"role": "user", "content": "Say OK."}]
    free = smollm_llm.chat(conv, SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)[0]
    assert free.outputs.token_ids[-1] == 2  # ends with <|im_end|>
    n = len(free.outputs.token_ids) + 3
    forced = smollm_llm.chat(conv, SamplingParams(temperature=0, max_tokens=n, min_tokens=n), use_tqdm=False)[0]
    assert len(forced.outputs.token_ids) == n and 2 not in forced.outputs.token_ids


def test_a_request_failing_at_run_time_does_not_take_the_batch_down(smollm_llm, monkeypatch):
    from fastdeploy.output.detokenizer import IncrementalDetokenizer

    original = IncrementalDetokenizer.add_token

    def failing(self, token_id):
        if "BOOM" in self.tokenizer.decode(self.prompt_tail):
            raise RuntimeError("detokenizer exploded")
        return original(self, token_id)

    original_init = IncrementalDetokenizer.__init__

    def init(self, tokenizer, prompt_token_ids, skip_special_tokens):
        original_init(self, tokenizer, prompt_token_ids, skip_special_tokens)
        self.prompt_tail = list(prompt_token_ids[-4:])

    monkeypatch.setattr(IncrementalDetokenizer, "__init__", init)
    monkeypatch.setattr(IncrementalDetokenizer, "add_token", failing)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    outputs = smollm_llm.generate(["Good morning", "say BOOM", "The sea is"], params, use_tqdm=False)
    assert [o.error_code for o in outputs] == [200, 500, 200]
    assert "detokenizer exploded" in outputs[1].error_msg and outputs[1].outputs.finish_reason == "abort"
    assert len(outputs[0].outputs.token_ids) == 6 and len(outputs[2].outputs.token_ids) == 6
    assert not smollm_llm.llm_engine.has_unfinished_requests()
