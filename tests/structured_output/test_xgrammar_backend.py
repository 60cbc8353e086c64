"""The optional xgrammar backend (`LLM(guided_decoding_backend="xgrammar")`): its token masks equal
llguidance's bit for bit along forced token paths (regex, choice, GBNF and Lark grammars: two
independent implementations of the same languages over the same vocabulary), its constrained outputs
validate (jsonschema) or fully match (re), its faults are ValueErrors naming the prompt, and without
the package the LLM fails at construction naming the extra."""
import builtins
import json
import re

import numpy as np
import pytest
from constraints import IPV4, PERSON, PERSON_CHAT, validate_json, whitespace_runs_outside_strings
from helpers import SMOLLM_BLOCK_SIZE, SMOLLM_MAX_MODEL_LEN, assert_engine_idle, chat, run

from fastdeploy import LLM, GuidedDecodingParams, SamplingParams
from fastdeploy.engine.engine import LLMEngine
from fastdeploy.structured_output.grammar import GrammarSpec, grammar_spec
from fastdeploy.structured_output.guidance import GuidanceBackend
from fastdeploy.structured_output.xgrammar_backend import XGrammarBackend

GBNF = 'root ::= "SELECT " col " FROM " tab ";"\ncol ::= "id" | "name" | "*"\ntab ::= "users" | "orders" [0-9]?'
GBNF_PATTERN = r"SELECT (id|name|\*) FROM (users|orders[0-9]?);"
LARK = 'start: "(" NUM ("," NUM)* ")"\nNUM: /[0-9]{1,3}/'
LARK_PATTERN = r"\([0-9]{1,3}(,[0-9]{1,3})*\)"
DATE = r"[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"


def constrained(max_tokens=200, **kwargs):
    guided = {k: kwargs.pop(k) for k in list(kwargs) if k in GuidedDecodingParams.__dataclass_fields__}
    return SamplingParams(max_tokens=max_tokens, guided_decoding=GuidedDecodingParams(**guided), **kwargs)


def completions(output):
    return output.outputs if isinstance(output.outputs, list) else [output.outputs]


@pytest.fixture(scope="module")
def xgr_llm():
    """The default model (model=None) with the xgrammar backend, as smollm_llm's settings."""
    llm = LLM(guided_decoding_backend="xgrammar", max_model_len=SMOLLM_MAX_MODEL_LEN, block_size=SMOLLM_BLOCK_SIZE,
              max_num_seqs=16)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def both(smollm_llm):
    """(llguidance, xgrammar) backends on the engine's tokenizer, vocabulary and EOS ids."""
    manager = smollm_llm.llm_engine.structured_output
    args = (manager.tokenizer, manager.vocab_size, manager.eos_token_ids)
    return GuidanceBackend(*args), XGrammarBackend(*args), manager


# ---- masks: xgrammar against llguidance ------------------------------------------------------------
def char_tokens(tok, text):
    """`text` one token per character (a path off the tokenizer's own segmentation)."""
    ids = [tok.encode(ch, add_special_tokens=False) for ch in text]
    assert all(len(i) == 1 for i in ids), text
    return [i[0] for i in ids]


def allowed_ids(row, vocab_size):
    """The token ids a packed mask row allows (bit t % 32 of word t // 32)."""
    return np.flatnonzero(np.unpackbits(row.view(np.uint8), bitorder="little")[:vocab_size])


CHOICES = ["red", "green", "blue", "Nice (city)", 'say "hi"', "gre"]
CHOICE_PATTERN = "|".join(re.escape(c) for c in CHOICES)
PATHS = [  # (spec, the oracle pattern, a text of its language, segmentations)
    (GrammarSpec("regex", IPV4), IPV4, "192.168.10.254", ("tokenizer", "characters")),
    (GrammarSpec("regex", IPV4), IPV4, "8.8.8.8", ("tokenizer", "characters")),
    (GrammarSpec("regex", DATE), DATE, "2024-02-29", ("tokenizer", "characters")),
    (GrammarSpec("regex", "(yes|no)"), "(yes|no)", "no", ("tokenizer", "characters")),
    (GrammarSpec("choice", json.dumps(CHOICES)), CHOICE_PATTERN, "Nice (city)", ("tokenizer",)),
    (GrammarSpec("choice", json.dumps(CHOICES)), CHOICE_PATTERN, 'say "hi"', ("tokenizer",)),
    (GrammarSpec("choice", json.dumps(CHOICES)), CHOICE_PATTERN, "green", ("tokenizer",)),
    (GrammarSpec("grammar", GBNF), GBNF_PATTERN, "SELECT name FROM orders7;", ("tokenizer",)),
    (GrammarSpec("grammar", LARK), LARK_PATTERN, "(12,7,305)", ("tokenizer", "characters")),
]


@pytest.mark.parametrize("spec,pattern,text,segmentation",
                         [(*case[:3], seg) for case in PATHS for seg in case[3]])
def test_masks_equal_llguidance_bit_for_bit(both, spec, pattern, text, segmentation):
    """Along a path of tokens (the tokenizer's, or one per character where no text of several
    characters is forced: llguidance allows only its canonical token there), at every step: both
    backends allow EOS exactly where the text so far is complete (Python's `re.fullmatch` of the
    language's pattern: the oracle), and their masks, filled as a batch of two rows (the path's
    matcher and a fresh one) in one call, are equal bit for bit, except where the grammar forces a
    text of several characters: there llguidance allows the one token it tokenizes that text with,
    and xgrammar also the shorter tokens the forced text starts with."""
    guidance, xgrammar, manager = both
    tok, vocab_size, eos = manager.tokenizer, manager.vocab_size, set(manager.eos_token_ids)
    ids = tok.encode(text, add_special_tokens=False) if segmentation == "tokenizer" else char_tokens(tok, text)
    assert tok.decode(ids) == text

    def rows_agree(ours, theirs, rest) -> bool:
        if np.array_equal(ours, theirs):
            return True
        ours, theirs = (set(allowed_ids(row, vocab_size).tolist()) for row in (ours, theirs))
        assert len(theirs) == 1 and theirs < ours, (theirs, ours)
        assert all(rest.startswith(tok.decode([t])) for t in ours), (rest, ours)
        return False

    words = (vocab_size + 31) // 32
    g, x = guidance.matcher(guidance.compile(spec)), xgrammar.matcher(xgrammar.compile(spec))
    equal_steps = 0
    for step, token in enumerate(ids + [None]):
        masks = np.full((2, 2, words), -1, np.int32)  # [backend, row, word]; -1: an unwritten row shows
        guidance.fill_bitmask([g, guidance.matcher(guidance.compile(spec))], masks[0])
        xgrammar.fill_bitmask([x, xgrammar.matcher(xgrammar.compile(spec))], masks[1])
        done = tok.decode(ids[:step])
        complete = re.fullmatch(pattern, done) is not None
        for allowed in (set(allowed_ids(masks[b, 0], vocab_size).tolist()) for b in (0, 1)):
            assert (allowed >= eos) == complete and (complete or not allowed & eos), step
            assert token is None or token in allowed, step
        equal_steps += rows_agree(masks[1, 0], masks[0, 0], text[len(done):])
        rows_agree(masks[1, 1], masks[0, 1], text)
        if token is not None:
            assert guidance.accept_token(g, token) and xgrammar.accept_token(x, token)
    assert equal_steps >= (len(ids) + 1) / 2, equal_steps  # most steps force no text
    assert xgrammar.accept_token(x, sorted(eos)[0]) and x.is_terminated()


def test_a_rejected_token_is_refused(both):
    _, xgrammar, manager = both
    matcher = xgrammar.matcher(xgrammar.compile(GrammarSpec("regex", "(yes|no)")))
    assert not xgrammar.accept_token(matcher, manager.tokenizer.convert_tokens_to_ids("x"))
    assert not xgrammar.accept_token(matcher, sorted(manager.eos_token_ids)[0])  # not complete yet
    assert not matcher.is_terminated()


def test_tokenizer_wrappers_and_non_tokenizers(both):
    """A wrapper holding the transformers tokenizer (Ernie4_5Tokenizer) builds the same masks; an
    object that is no transformers tokenizer is a ValueError naming its type."""
    from fastdeploy.input.ernie4_5_tokenizer import Ernie4_5Tokenizer

    _, xgrammar, manager = both
    wrapped = XGrammarBackend(Ernie4_5Tokenizer(manager.tokenizer), manager.vocab_size, manager.eos_token_ids)
    spec = GrammarSpec("regex", IPV4)
    masks = np.zeros((2, 1, (manager.vocab_size + 31) // 32), np.int32)
    for backend, mask in zip((xgrammar, wrapped), masks):
        backend.fill_bitmask([backend.matcher(backend.compile(spec))], mask)
    np.testing.assert_array_equal(masks[0], masks[1])
    assert masks[0].any()
    with pytest.raises(ValueError, match="needs a transformers tokenizer; object"):
        XGrammarBackend(object(), manager.vocab_size, manager.eos_token_ids)


def test_json_whitespace_modes(both):
    """disable_any_whitespace: none between typed tokens; the bounded default: at most 21 whitespace
    characters per gap (a newline and 20 spaces fit, 22 spaces do not)."""
    _, xgrammar, manager = both
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items":
                                                                            {"type": "integer"}}}}
    tok = manager.tokenizer

    def accepts(spec, text):
        matcher = xgrammar.matcher(xgrammar.compile(spec))
        return all(xgrammar.accept_token(matcher, t) for t in tok.encode(text, add_special_tokens=False))

    compact = grammar_spec(GuidedDecodingParams(json=schema, disable_any_whitespace=True))
    bounded = grammar_spec(GuidedDecodingParams(json=schema))
    assert accepts(compact, '{"a":1,"b":[1,2]}') and not accepts(compact, '{"a": 1}')
    assert accepts(bounded, '{"a":1,"b":[1,2]}') and accepts(bounded, '{ "a": 1,\n' + " " * 20 + '"b": [1, 2] }')
    assert not accepts(bounded, '{' + " " * 22 + '"a": 1}')
    with pytest.raises(ValueError, match="whitespace_pattern.*guidance"):
        xgrammar.compile(grammar_spec(GuidedDecodingParams(json=schema, whitespace_pattern=r"[ ]*")))


def test_structural_tag(both):
    """Free text until a trigger; then the structure's begin, a JSON value of its schema, its end."""
    _, xgrammar, manager = both
    tag = {"structures": [{"begin": "<fn=add>", "schema": {"type": "object", "properties": {"x": {"type": "integer"}},
                                                           "required": ["x"]}, "end": "</fn>"}],
           "triggers": ["<fn="]}
    compiled = xgrammar.compile(GrammarSpec("structural_tag", json.dumps(tag)))
    tok = manager.tokenizer

    def accepts(text):
        matcher = xgrammar.matcher(compiled)
        return all(xgrammar.accept_token(matcher, t) for t in tok.encode(text, add_special_tokens=False))

    assert accepts('Sure. <fn=add>{"x": 3}</fn> done')
    assert not accepts('Sure. <fn=add>{"y": 3}')
    with pytest.raises(ValueError, match="structures"):
        xgrammar.compile(GrammarSpec("structural_tag", '{"triggers": []}'))


# ---- end to end --------------------------------------------------------------------------------------
def test_json_schema_validates_greedy_and_sampled(xgr_llm):
    outs = chat(xgr_llm, [PERSON_CHAT] * 3,
                [constrained(json=PERSON, temperature=0), constrained(json=PERSON, temperature=0.9, n=2, seed=4),
                 constrained(json=PERSON, temperature=0.9, seed=8, disable_any_whitespace=True)])
    texts = [c for o in outs for c in completions(o)]
    assert len(texts) == 4
    for c in texts:
        assert c.finish_reason == "stop", c.text
        assert list(validate_json(c.text, PERSON)) == list(PERSON["properties"]), c.text  # declared order
    assert whitespace_runs_outside_strings(texts[-1].text) == []
    for run_ in (r for c in texts[:-1] for r in whitespace_runs_outside_strings(c.text)):
        assert len(run_) <= 21 and set(run_) <= set(" \t\r\n"), run_
    assert_engine_idle(xgr_llm)


def test_llguidance_keeps_the_declared_property_order_too(smollm_llm):
    out = chat(smollm_llm, [PERSON_CHAT], constrained(json=PERSON, temperature=0, disable_any_whitespace=True))
    assert list(validate_json(out[0].outputs.text, PERSON)) == list(PERSON["properties"])


def test_regex_choice_and_grammars(xgr_llm):
    choices = ["Paris", "Lyon", "Nice (city)", 'a "quoted" one']
    cases = [
        (constrained(regex=IPV4, temperature=0), IPV4),
        (constrained(regex=DATE, temperature=1.0, n=2, seed=3), DATE),
        (constrained(choice=choices, temperature=1.0, n=3, seed=9), "|".join(re.escape(c) for c in choices)),
        (constrained(grammar=GBNF, temperature=0), GBNF_PATTERN),
        (constrained(grammar=LARK, max_tokens=60, temperature=0), LARK_PATTERN),
    ]
    outs = run(xgr_llm, ["An IP address:", "A date:", "A French city:", "An SQL query:", "A tuple:"],
               [p for p, _ in cases])
    for out, (_, pattern) in zip(outs, cases):
        for c in completions(out):
            assert c.finish_reason == "stop", c.text
            assert re.fullmatch(pattern, c.text), (pattern, c.text)


def test_json_object_is_an_object(xgr_llm):
    out = run(xgr_llm, ["A config file in JSON:"], constrained(json_object=True, temperature=0, max_tokens=150))
    assert out[0].outputs.finish_reason == "stop", out[0].outputs.text
    assert isinstance(json.loads(out[0].outputs.text), dict)


@pytest.mark.parametrize("guided,fault", [
    ({"regex": "a(b"}, r"(?s)prompt 1: guided_decoding\.regex does not compile \(xgrammar\): .*parenthesis"),
    ({"grammar": 'root ::= "a" missing'}, r"(?s)prompt 1: guided_decoding\.grammar does not compile .*missing"),
    ({"grammar": '%llguidance {}\nstart: "a"'}, r"prompt 1: guided_decoding\.grammar does not compile \(xgrammar\)"),
    ({"json": {"type": "objekt"}}, r"(?s)prompt 1: guided_decoding\.json does not compile .*objekt"),
    ({"structural_tag": '{"structures": []}'}, r"prompt 1: guided_decoding\.structural_tag does not compile"),
    ({"structural_tag": '{"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": ["<b"]}'},
     r"prompt 1: guided_decoding\.structural_tag does not compile \(xgrammar\): .*does not match any trigger"),
    ({"grammar": "start: /[/"}, r"(?s)prompt 1: guided_decoding\.grammar does not compile \(xgrammar\): Lark .*\["),
    ({"json": {"type": "object"}, "whitespace_pattern": r"\s*"}, r"prompt 1: .*whitespace regex"),
])
def test_a_bad_constraint_is_a_value_error_before_any_work(xgr_llm, guided, fault):
    good = constrained(choice=["a", "b"], temperature=0)
    with pytest.raises(ValueError, match=fault) as error:
        run(xgr_llm, ["x", "y"], [good, SamplingParams(guided_decoding=GuidedDecodingParams(**guided))])
    assert ".cc:" not in str(error.value) and "Check failed" not in str(error.value)  # C++ detail dropped
    assert_engine_idle(xgr_llm)
    assert xgr_llm.llm_engine.structured_output.requests == {}


def test_without_xgrammar_the_llm_fails_at_construction_naming_the_extra(monkeypatch):
    real_import = builtins.__import__

    def hide_xgrammar(name, *args, **kwargs):
        if name == "xgrammar" or name.startswith("xgrammar."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    def refuse(cls, args):
        raise AssertionError("the model was being loaded although the backend cannot be built")

    monkeypatch.setattr(builtins, "__import__", hide_xgrammar)
    monkeypatch.setattr(LLMEngine, "from_engine_args", classmethod(refuse))
    with pytest.raises(ImportError, match=r'(?s)xgrammar.*torch==2\.13\.0.*pip install "fastdeploy\[xgrammar\]"'):
        LLM(guided_decoding_backend="xgrammar")
    with pytest.raises(AssertionError, match="being loaded"):  # the other backends need nothing more
        LLM(guided_decoding_backend="guidance")
