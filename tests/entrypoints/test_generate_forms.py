"""LLM.generate / LLM.chat input forms, output order, progress bar and run-time failures, on the
default model. (Output fields: test_logprobs_contract.py; stops and min_tokens: test_stops.py.)"""
import copy
import dataclasses

from helpers import SMOLLM_MAX_MODEL_LEN, chat, first, greedy, run

GREEDY = greedy(8, ignore_eos=True)


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
    results = [run(smollm_llm, form, GREEDY) for form in forms]
    for outputs in results:
        assert len(outputs) == 1
        assert outputs[0].prompt_token_ids == ids
        assert outputs[0].outputs.token_ids == results[0][0].outputs.token_ids
    assert results[0][0].prompt == text
    assert len(results[0][0].outputs.token_ids) == 8


def test_batch_of_very_different_lengths_comes_back_in_input_order(smollm_llm):
    prompts = ["Hi", "Tell me a long story about " + "a dragon and a knight, " * 60, "1 2 3", "Why?" * 20]
    params = [greedy(n, ignore_eos=True) for n in (5, 9, 3, 7)]
    batched = run(smollm_llm, prompts, params)
    alone = [run(smollm_llm, p, sp)[0] for p, sp in zip(prompts, params)]
    assert [o.prompt for o in batched] == prompts
    assert _tokens(batched) == _tokens(alone)
    assert [len(o.outputs.token_ids) for o in batched] == [5, 9, 3, 7]


def test_chat_single_conversation_and_batch(smollm_llm):
    conv = [{"role": "user", "content": "Name a fruit."}]
    single = chat(smollm_llm, conv, GREEDY)
    batch = chat(smollm_llm, [conv, [{"role": "user", "content": "Name a color."}]], GREEDY)
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
    params = greedy(5000, stop=["\n\n"])
    room = 8
    ids = smollm_llm.get_tokenizer().encode("one two three " * 400, add_special_tokens=False)
    ids = ids[: SMOLLM_MAX_MODEL_LEN - room]
    assert len(ids) == SMOLLM_MAX_MODEL_LEN - room
    prompt = {"prompt_token_ids": ids}
    before_params, before_prompt = dataclasses.asdict(params), copy.deepcopy(prompt)
    outputs = run(smollm_llm, [prompt, prompt], params)
    assert all(len(o.outputs.token_ids) <= room for o in outputs)
    assert dataclasses.asdict(params) == before_params
    assert prompt == before_prompt


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
    params = greedy(6, ignore_eos=True)
    prompts = ["Good morning", "say BOOM", "The sea is"]
    outputs = run(smollm_llm, prompts, params)
    assert [o.error_code for o in outputs] == [200, 500, 200]
    assert "detokenizer exploded" in outputs[1].error_msg and outputs[1].outputs.finish_reason == "abort"
    # the others finish as they would alone, and the LLM serves the next call
    for i in (0, 2):
        assert outputs[i].outputs.token_ids == first(smollm_llm, prompts[i], params).token_ids
        assert len(outputs[i].outputs.token_ids) == 6
