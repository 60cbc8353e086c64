"""Tool calls through the API: LLM(tool_call_parser=), LLM.chat(tools=, tool_choice=), the output
processor filling `tool_calls`.

Oracles: the texts fed in (their calls' JSON written here), the rendered prompt checked against
the tools' own JSON (`json.dumps`), and `tool_choice_schema` for the constraint a forced
tool_choice puts on the request. Guided decoding itself is the engine's (structured_output/); the
forced tool_choice tests replace the generation by a text that validates under the schema
(`jsonschema`), as the constrained output would.
"""
import json
from types import SimpleNamespace

import jsonschema
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.sampling_params import GuidedDecodingParams
from fastdeploy.entrypoints import chat_utils
from fastdeploy.output.output_processor import OutputProcessor
from fastdeploy.reasoning import get_reasoning_parser
from fastdeploy.tool_parsers import get_tool_parser
from fastdeploy.tool_parsers.tool_choice import tool_choice_schema
from fastdeploy.worker.output import ModelRunnerOutput

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time"}}
TOOLS = [WEATHER, NOW]
# Qwen2.5/Qwen3's way of placing tools, calls and results, cut down to what the tests need
QWEN_STYLE = """{%- if tools %}<|im_start|>system
# Tools
<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags.<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == "assistant" and message.tool_calls %}<|im_start|>assistant
{%- for call in message.tool_calls %}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == "tool" %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>'
HISTORY = ASK + [
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
]


def test_unknown_tool_call_parser_is_rejected_before_loading(no_loading):
    with pytest.raises(ValueError, match=r"^tool_call_parser 'mistral' is not supported; valid names: .*hermes"):
        LLM(tool_call_parser="mistral")


# ---- rendering -------------------------------------------------------------------------------------
def test_tools_calls_and_results_reach_the_template(smollm_llm):
    prompt = chat_utils.render_conversation(smollm_llm.get_tokenizer(), HISTORY, QWEN_STYLE, None, tools=TOOLS)
    for tool in TOOLS:
        assert json.dumps(tool, ensure_ascii=False) in prompt
    # the call's arguments reach the template as an object, not as a JSON string inside JSON
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"temp_c": 21}\n</tool_response>' in prompt
    assert prompt.endswith("<|im_start|>assistant\n")
    without = chat_utils.render_conversation(smollm_llm.get_tokenizer(), HISTORY, QWEN_STYLE, None)
    assert "<tools>" not in without and "<tool_response>" in without


def test_chat_renders_the_tools_into_the_prompt(smollm_llm):
    out = smollm_llm.chat(ASK, SamplingParams(max_tokens=1), use_tqdm=False, chat_template=QWEN_STYLE, tools=WEATHER,
                          tool_choice="none")[0]
    assert out.prompt == chat_utils.render_conversation(smollm_llm.get_tokenizer(), ASK, QWEN_STYLE, None, tools=[WEATHER])
    assert out.outputs[0].tool_calls is None


@pytest.mark.parametrize("conversation, error, message", [
    ([{"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}],
     ValueError, r"^conversation 0, message 0, tool_calls\[0\]: 'arguments' is not valid JSON"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]}],
     ValueError, r"^conversation 0, message 0, tool_calls\[0\]: needs"),
    ([{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "[1]"}}]}],
     ValueError, r"'arguments' must be a JSON object"),
    ([{"role": "user", "content": "hi", "tool_calls": []}], ValueError, r"^conversation 0, message 0: only assistant"),
    ([{"role": "assistant", "content": "", "tool_calls": {"name": "f"}}], TypeError, r"'tool_calls' must be a list"),
])
def test_bad_tool_call_messages(smollm_llm, conversation, error, message):
    with pytest.raises(error, match=message):
        smollm_llm.chat(conversation, chat_template=QWEN_STYLE, use_tqdm=False)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"tools": [WEATHER, {"type": "function", "function": {"name": 3}}]}, ValueError, r"^tools\[1\]\.function: 'name'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, ValueError,
     r"^tool_choice names function 'get_time'"),
    ({"tools": TOOLS, "tool_choice": "auto"}, ValueError, r"^tool_choice='auto' needs a tool call parser"),
    ({"tools": TOOLS, "chat_template_kwargs": {"tools": TOOLS}}, ValueError, r"must not set 'tools'"),
])
def test_bad_tools_arguments_fail_before_any_work(smollm_llm, monkeypatch, kwargs, error, message):
    monkeypatch.setattr(smollm_llm, "_run", lambda *a, **k: pytest.fail("ran"))
    with pytest.raises(error, match=message):
        smollm_llm.chat(ASK, chat_template=QWEN_STYLE, use_tqdm=False, **kwargs)


# ---- tool_choice: what reaches the engine, and the parse-back ----------------------------------
def fake_run(llm, texts, seen):
    """LLM._run with the model replaced: each prompt is queued in the real engine (its on_queued
    hook called), and its completions get `texts`' tokens then EOS through the real output
    processor, as engine steps would give them. Records the params and whether a hook was given."""
    engine = llm.llm_engine
    tokenizer, eos = llm.get_tokenizer(), llm.get_tokenizer().convert_tokens_to_ids("<|im_end|>")

    def run(items, params, use_tqdm, what, on_queued=None):
        seen.update(params=params, hooked=on_queued is not None)
        outputs = []
        for i, ((text, ids, mm), p) in enumerate(zip(items, params)):
            request_id = engine.enqueue(engine.make_request(text, ids, p, i, mm))
            if on_queued is not None:
                on_queued(request_id)
            streams = {s.request_id: tokenizer.encode(t, add_special_tokens=False) + [eos]
                       for s, t in zip(engine.output_processor.groups[request_id].completions, texts)}
            for state in engine.output_processor.groups[request_id].completions:
                engine.output_processor.on_scheduled(state.request_id, 0.0, None)
            for step in range(max(map(len, streams.values()))):
                finished, done = engine.output_processor.process(ModelRunnerOutput(
                    sampled_token_ids={r: [s[step]] for r, s in streams.items() if step < len(s)}))
                engine.finish_requests(finished)
                outputs += done
        return outputs

    return run


@pytest.mark.parametrize("choice, answers, expected", [
    ("required",
     ['[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "now", "parameters": {}}]',
      '[{"name": "now", "parameters": {}}]'],
     [[("get_weather", {"city": "Paris"}), ("now", {})], [("now", {})]]),
    ({"type": "function", "function": {"name": "get_weather"}},
     ['{"city": "Zürich"}', '{"city": "北京"}'],
     [[("get_weather", {"city": "Zürich"})], [("get_weather", {"city": "北京"})]]),
])
def test_forced_tool_choice_constrains_each_request_and_parses_the_json(smollm_llm, monkeypatch, choice, answers, expected):
    schema = tool_choice_schema(TOOLS, choice)
    for answer in answers:  # what the constrained output is: JSON valid under the schema
        jsonschema.validate(json.loads(answer), schema)
    seen = {}
    monkeypatch.setattr(smollm_llm, "_run", fake_run(smollm_llm, answers, seen))
    mine = SamplingParams(n=2, temperature=0.5, max_tokens=64)
    outs = smollm_llm.chat([ASK, ASK], mine, chat_template=QWEN_STYLE, tools=TOOLS, tool_choice=choice, use_tqdm=False)
    assert seen["hooked"]
    for p in seen["params"]:
        assert p.guided_decoding == GuidedDecodingParams(json=schema) and (p.n, p.temperature, p.max_tokens) == (2, 0.5, 64)
    assert mine.guided_decoding is None  # the caller's params are left alone
    for out in outs:
        got = [[(c.function.name, json.loads(c.function.arguments)) for c in completion.tool_calls]
               for completion in out.outputs]
        assert got == expected and [c.text for c in out.outputs] == ["", ""]


def test_forced_output_is_read_after_a_reasoning_split_that_drops_it(smollm_llm, monkeypatch):
    # ernie-x1's reasoning parser keeps only <response> text as the answer: the forced JSON after
    # </think> is still read
    monkeypatch.setattr(smollm_llm.llm_engine.output_processor, "reasoning_parser", get_reasoning_parser("ernie-x1"))
    monkeypatch.setattr(smollm_llm, "_run", fake_run(smollm_llm, ['plan\n</think>\n\n{"city": "Paris"}'], {}))
    out = smollm_llm.chat(ASK, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                          chat_template=QWEN_STYLE, use_tqdm=False)[0].outputs[0]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in out.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert (out.reasoning_content, out.text) == ("plan\n", "")


def test_forced_output_that_is_not_a_call_keeps_its_text(smollm_llm, monkeypatch):
    monkeypatch.setattr(smollm_llm, "_run", fake_run(smollm_llm, ['[{"name": "now", "para'], {}))
    out = smollm_llm.chat(ASK, tools=TOOLS, tool_choice="required", chat_template=QWEN_STYLE, use_tqdm=False)[0]
    assert out.outputs[0].tool_calls is None and out.outputs[0].text == '[{"name": "now", "para'


def test_forced_tool_choice_refuses_a_request_that_has_its_own_constraint(smollm_llm, monkeypatch):
    monkeypatch.setattr(smollm_llm, "_run", lambda *a, **k: pytest.fail("ran"))
    params = [SamplingParams(), SamplingParams(guided_decoding=GuidedDecodingParams(regex="a+"))]
    with pytest.raises(ValueError, match=r"^the sampling_params of conversation 1 have guided_decoding \(regex\)"):
        smollm_llm.chat([ASK, ASK], params, tools=TOOLS, tool_choice="required", chat_template=QWEN_STYLE, use_tqdm=False)


@pytest.mark.parametrize("choice, calls", [(None, True), ("none", False)])
def test_unforced_tool_choice_adds_no_constraint(smollm_llm, monkeypatch, choice, calls):
    monkeypatch.setattr(smollm_llm.llm_engine.output_processor, "tool_parser", get_tool_parser("qwen3"))
    seen = {}
    monkeypatch.setattr(smollm_llm, "_run", fake_run(smollm_llm, [f"Sure.\n{CALL}"], seen))
    out = smollm_llm.chat(ASK, tools=TOOLS, tool_choice=choice, chat_template=QWEN_STYLE, use_tqdm=False)[0]
    assert seen["params"][0].guided_decoding is None
    if calls:  # the engine's tool_call_parser reads it
        assert [c.function.name for c in out.outputs[0].tool_calls] == ["get_weather"] and out.outputs[0].text == "Sure."
    else:  # "none": nothing parsed
        assert out.outputs[0].tool_calls is None and out.outputs[0].text == f"Sure.\n{CALL}"


# ---- the output processor ------------------------------------------------------------------------
def finish(processor, tokenizer, texts, eos, skip=False):
    """Queue one prompt with a completion per text, feed each text's tokens then EOS through
    OutputProcessor.process (as engine steps would), return the prompt's RequestOutput."""
    prompt_ids = tokenizer.encode("Weather?", add_special_tokens=False)
    prepared = SimpleNamespace(prompt="Weather?", prompt_token_ids=prompt_ids,
                               sampling_params=SamplingParams(n=len(texts), max_tokens=500),
                               num_placeholder_tokens=lambda modality: 0)
    ids = [f"r-{i}" for i in range(len(texts))]
    processor.add_prompt("r", ids, prepared, frozenset({eos}))
    for i in ids:
        processor.on_scheduled(i, 0.0, None)
    if skip:
        processor.set_tool_call_reader("r", None)
    streams = {i: tokenizer.encode(t, add_special_tokens=False) + [eos] for i, t in zip(ids, texts)}
    outputs = []
    for step in range(max(map(len, streams.values()))):
        _, done = processor.process(ModelRunnerOutput(
            sampled_token_ids={i: [s[step]] for i, s in streams.items() if step < len(s)}))
        outputs += done
    assert len(outputs) == 1
    return outputs[0]


def test_output_processor_fills_tool_calls_after_the_reasoning_split(smollm_llm):
    tokenizer = smollm_llm.get_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    processor = OutputProcessor(tokenizer, get_reasoning_parser("qwen3"), get_tool_parser("qwen3"))
    texts = [f"<think>\nThey ask for weather. {CALL.replace('Paris', 'Lyon')}?\n</think>\n\nChecking.\n{CALL}",
             "<think>\nsmall talk\n</think>\n\nHello!"]
    out = finish(processor, tokenizer, texts, eos)
    called, plain = out.outputs
    assert [(c.function.name, json.loads(c.function.arguments)) for c in called.tool_calls] == [
        ("get_weather", {"city": "Paris", "days": [1, 2]})]  # not the Lyon call inside the thinking
    assert called.text == "Checking."
    assert called.reasoning_content == f"\nThey ask for weather. {CALL.replace('Paris', 'Lyon')}?\n"
    assert called.finish_reason == "stop"
    assert plain.tool_calls is None and plain.text == "\n\nHello!" and plain.reasoning_content == "\nsmall talk\n"


def test_output_processor_without_reasoning_parser_keeps_thinking_in_text(smollm_llm):
    tokenizer = smollm_llm.get_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = finish(OutputProcessor(tokenizer, None, get_tool_parser("hermes")), tokenizer,
                 [f"<think>hm</think>\n{CALL}"], eos)
    assert [c.function.name for c in out.outputs[0].tool_calls] == ["get_weather"]
    assert out.outputs[0].text == "<think>hm</think>" and out.outputs[0].reasoning_content is None


def test_output_processor_skips_prompts_it_is_told_to(smollm_llm):
    tokenizer = smollm_llm.get_tokenizer()
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    out = finish(OutputProcessor(tokenizer, None, get_tool_parser("qwen3")), tokenizer, [CALL], eos, skip=True)
    assert out.outputs[0].tool_calls is None and out.outputs[0].text == CALL


def test_llm_hands_the_configured_parser_to_the_output_processor(smollm_path):
    from helpers import SMOLLM_BLOCK_SIZE, SMOLLM_MAX_MODEL_LEN

    llm = LLM(model=smollm_path, max_model_len=SMOLLM_MAX_MODEL_LEN, block_size=SMOLLM_BLOCK_SIZE,
              tool_call_parser="ernie_x1")
    try:
        assert llm.llm_engine.output_processor.tool_parser.name == "ernie-x1"
        out = llm.generate("The capital of France is", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
        assert out.outputs[0].tool_calls is None and out.outputs[0].text  # no call block: text as generated
    finally:
        llm.shutdown()


CITY_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_tool_calls_round_trip_through_the_grammar(smollm_llm, choice):
    """Real constrained generation: the output validates under tool_choice_schema, and the parsed
    tool_calls hold exactly the calls the generated JSON holds (greedy, and sampled with n = 2)."""
    tools = [CITY_TOOL, NOW]
    schema = tool_choice_schema(tools, choice)
    params = [SamplingParams(temperature=0, max_tokens=160),
              SamplingParams(n=2, temperature=0.8, seed=4, max_tokens=160)]
    outs = smollm_llm.chat([ASK, ASK], params, chat_template=QWEN_STYLE, tools=tools, tool_choice=choice,
                           use_tqdm=False)
    completions = [c for out in outs for c in out.outputs]
    assert len(completions) == 3
    for c in completions:
        assert c.finish_reason == "stop", c.text
        generated = json.loads(smollm_llm.get_tokenizer().decode(c.token_ids, skip_special_tokens=True))
        jsonschema.validate(generated, schema)
        expected = ([(call["name"], call["parameters"]) for call in generated] if choice == "required"
                    else [("get_weather", generated)])
        assert [(t.function.name, json.loads(t.function.arguments)) for t in c.tool_calls] == expected
        assert all(t.id.startswith("call_") and t.type == "function" for t in c.tool_calls)
