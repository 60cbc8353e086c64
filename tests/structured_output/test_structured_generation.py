"""Constrained generation on the default model through the public API: every output of a finished
request parses and validates (jsonschema) or fully matches (re), greedy and sampled, n > 1; errors
before any work; whitespace bounds; batches mixing constrained and free requests."""
import json
import re

import pytest
from constraints import IPV4, PERSON, PERSON_CHAT, validate_json, whitespace_runs_outside_strings
from helpers import assert_engine_idle, chat, run

from fastdeploy import GuidedDecodingParams, SamplingParams, StructuredOutputsParams


def constrained(max_tokens=200, **kwargs):
    guided = {k: kwargs.pop(k) for k in list(kwargs) if k in GuidedDecodingParams.__dataclass_fields__}
    return SamplingParams(max_tokens=max_tokens, guided_decoding=GuidedDecodingParams(**guided), **kwargs)


def completions(output):
    return output.outputs if isinstance(output.outputs, list) else [output.outputs]


def test_json_schema_greedy_and_sampled(smollm_llm):
    params = [constrained(json=PERSON, temperature=0),
              constrained(json=PERSON, temperature=0.8, top_p=0.95, n=3, seed=11),
              SamplingParams(max_tokens=200, temperature=0.7, seed=5,
                             structured_outputs=StructuredOutputsParams(json=json.dumps(PERSON)))]
    outs = chat(smollm_llm, [PERSON_CHAT] * 3, params)
    texts = [c for o in outs for c in completions(o)]
    assert len(texts) == 5
    for c in texts:
        assert c.finish_reason == "stop", c.text
        validate_json(c.text, PERSON)
    assert_engine_idle(smollm_llm)


def test_regex_choice_and_grammars(smollm_llm):
    gbnf = 'root ::= "SELECT " col " FROM " tab ";"\ncol ::= "id" | "name" | "*"\ntab ::= "users" | "orders" [0-9]?'
    lark = 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/'
    cases = [
        (constrained(regex=IPV4, temperature=0), IPV4),
        (constrained(regex=IPV4, temperature=1.0, n=2, seed=3), IPV4),
        (constrained(choice=["red", "green", "blue"], temperature=0), "red|green|blue"),
        (constrained(choice=["Paris", "Lyon", "Nice (city)"], temperature=1.0, n=3, seed=9),
         r"Paris|Lyon|Nice \(city\)"),
        (constrained(grammar=gbnf, temperature=0), r"SELECT (id|name|\*) FROM (users|orders[0-9]?);"),
        (constrained(grammar=lark, max_tokens=60, temperature=0), r"\([0-9]{1,3}(,[0-9]{1,3})*\)"),
    ]
    prompts = ["An IP address:", "An IP address:", "A color:", "A French city:", "An SQL query:", "A tuple:"]
    outs = run(smollm_llm, prompts, [p for p, _ in cases])
    for out, (_, pattern) in zip(outs, cases):
        for c in completions(out):
            assert c.finish_reason == "stop", c.text
            assert re.fullmatch(pattern, c.text), (pattern, c.text)


def test_json_object_is_an_object(smollm_llm):
    outs = run(smollm_llm, ["Some JSON:", "A config file in JSON:"],
               [constrained(json_object=True, temperature=0, max_tokens=120),
                constrained(json_object=True, temperature=0, max_tokens=120, disable_any_whitespace=True)])
    for out in outs:
        c = out.outputs
        if c.finish_reason == "stop":
            assert isinstance(json.loads(c.text), dict), c.text
        else:  # a prefix of an object
            assert c.text.startswith("{"), c.text


def test_whitespace_is_bounded_by_default_and_off_when_disabled(smollm_llm):
    """Default: each gap between JSON tokens is one space, or one newline and at most 20 spaces;
    disable_any_whitespace: none at all. Both validate."""
    outs = chat(smollm_llm, [PERSON_CHAT] * 3,
                [constrained(json=PERSON, temperature=0.9, seed=s, disable_any_whitespace=d)
                 for s, d in ((1, False), (2, False), (3, True))])
    for out, disabled in zip(outs, (False, False, True)):
        text = out.outputs.text
        validate_json(text, PERSON)
        runs = whitespace_runs_outside_strings(text)
        if disabled:
            assert runs == [], text
        for r in runs:
            assert r == " " or re.fullmatch(r"\n {0,20}", r), (r, text)


def test_constrained_and_free_requests_share_a_batch(smollm_llm):
    """Free requests give the same tokens as alone; the constrained ones still validate."""
    free = SamplingParams(temperature=0, max_tokens=24)
    alone = run(smollm_llm, ["The capital of France is", "Water boils at"], free)
    mixed = run(smollm_llm, ["The capital of France is", "Water boils at", "An IP address:"],
                [free, free, constrained(regex=IPV4, temperature=0)])
    for a, m in zip(alone, mixed):
        assert m.outputs.token_ids == a.outputs.token_ids
    assert re.fullmatch(IPV4, mixed[2].outputs.text)


def test_max_tokens_ends_with_length_and_a_valid_prefix(smollm_llm):
    import llguidance

    out = chat(smollm_llm, [PERSON_CHAT], constrained(json=PERSON, temperature=0, max_tokens=9))[0].outputs
    assert out.finish_reason == "length" and len(out.token_ids) == 9
    manager = smollm_llm.llm_engine.structured_output
    spec = manager.spec(constrained(json=PERSON))
    matcher = manager.backend.matcher(manager.compile(spec))
    assert matcher.try_consume_tokens(out.token_ids) == 9  # every token a step along a valid document
    assert isinstance(matcher, llguidance.LLMatcher) and not matcher.is_accepting()


def test_stop_strings_still_end_a_constrained_request(smollm_llm):
    out = chat(smollm_llm, [PERSON_CHAT], constrained(json=PERSON, temperature=0, stop=['"age"']))[0].outputs
    assert out.finish_reason == "stop" and out.stop_reason == '"age"'
    assert '"age"' not in out.text and out.text.startswith("{")


@pytest.mark.parametrize("guided,fault", [
    ({"regex": "a(b"}, r"(?s)prompt 1: guided_decoding\.regex does not compile .*unclosed group"),
    ({"grammar": 'root ::= "a" missing'}, r"(?s)prompt 1: guided_decoding\.grammar does not compile .*missing"),
    ({"json": '{"type": "object", "properties": '}, r"prompt 1: guided_decoding\.json is not valid JSON"),
    ({"json": {"type": "objekt"}}, r"(?s)prompt 1: guided_decoding\.json does not compile .*objekt"),
    ({"structural_tag": '{"structures": []}'}, r"prompt 1: guided_decoding\.structural_tag does not compile"),
])
def test_a_bad_constraint_is_a_value_error_before_any_work(smollm_llm, guided, fault):
    good = constrained(choice=["a", "b"], temperature=0)
    with pytest.raises(ValueError, match=fault):
        run(smollm_llm, ["x", "y"], [good, SamplingParams(guided_decoding=GuidedDecodingParams(**guided))])
    assert_engine_idle(smollm_llm)
    assert smollm_llm.llm_engine.structured_output.requests == {}


def test_one_kind_only_and_both_field_names():
    with pytest.raises(ValueError, match="only use one kind of guided decoding"):
        GuidedDecodingParams(json={"type": "object"}, regex="a")
    with pytest.raises(ValueError, match="empty list"):
        GuidedDecodingParams(choice=[])
    a, b = GuidedDecodingParams(regex="a"), GuidedDecodingParams(regex="b")
    with pytest.raises(ValueError, match="two names of one field"):
        SamplingParams(guided_decoding=a, structured_outputs=b)
    p = SamplingParams(structured_outputs={"choice": ["x", "y"]})
    assert p.guided_decoding.choice == ["x", "y"] and p.guided_decoding is p.structured_outputs
    assert GuidedDecodingParams(json_object=True).to_dict() == {"guided_json_object": True}
    assert GuidedDecodingParams().kind is None  # FastDeploy's rule: no kind, no constraint
