"""The structured-output schema set (benchmarks/structured_schemas.json): well formed, satisfiable, compilable.

The set is the workload of benchmarks/benchmark_structured.py and of the end-to-end structured-output
tests, which read it with the benchmark's `load_items` and check outputs with its `output_fault`. Each
item is a JSON Schema, a regex or a choice list, with a prompt and a hand-written example output. The
oracles here are independent of the engine: `jsonschema` (draft 2020-12) for the schemas and their
examples, Python's `re.fullmatch` for the regexes, and llguidance (the engine's default backend) on its
own, over a byte vocabulary: each schema and regex compiles and its matcher accepts the example.
"""
import json
import re
import sys
from pathlib import Path

import jsonschema
import llguidance
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from benchmark_structured import load_items, output_fault  # noqa: E402  (the set's loader and output checker)

ITEMS = load_items()
BY_KIND = {kind: [i for i in ITEMS if i["kind"] == kind] for kind in ("json", "regex", "choice")}


def test_set_size_and_names():
    assert {i["kind"] for i in ITEMS} == set(BY_KIND)
    assert len(BY_KIND["json"]) >= 24 and len(BY_KIND["regex"]) >= 4 and len(BY_KIND["choice"]) >= 4
    names = [i["name"] for i in ITEMS]
    assert len(set(names)) == len(names), "item names must be unique"
    for item in ITEMS:
        assert isinstance(item["prompt"], str) and item["prompt"].strip(), item["name"]


@pytest.mark.parametrize("item", BY_KIND["json"], ids=lambda i: i["name"])
def test_schema_is_valid_and_its_example_validates(item):
    jsonschema.Draft202012Validator.check_schema(item["schema"])
    # validated as output_fault reads an output: fractions as Decimal (float arithmetic gets
    # multipleOf 0.01 wrong: 19.99 / 0.01 is not an integer in floats)
    assert output_fault(item, json.dumps(item["example"])) is None


class ByteVocabulary:
    """A vocabulary of the 256 bytes plus EOS, in the shape llguidance.TokenizerWrapper reads: the
    grammar is checked on its own, without any model's tokenizer."""

    eos_token_id, bos_token_id, special_token_ids = 256, None, [256]
    tokens = [bytes([b]) for b in range(256)] + [b"<eos>"]

    def __call__(self, data: bytes) -> list[int]:
        return list(data)


BYTES = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteVocabulary()))


def assert_llguidance_accepts(grammar: str, text: str):
    """The grammar compiles, its matcher consumes `text` byte by byte and may stop there; one wrong last
    byte is refused (the matcher constrains something)."""
    assert llguidance.LLMatcher.validate_grammar(grammar) == ""
    matcher = llguidance.LLMatcher(BYTES, grammar)
    assert matcher.consume_tokens(list(text.encode())), matcher.get_error()
    assert matcher.is_accepting()
    assert not llguidance.LLMatcher(BYTES, grammar).consume_tokens(list((text[:-1] + "#").encode()))


@pytest.mark.parametrize("item", BY_KIND["json"], ids=lambda i: i["name"])
def test_schema_compiles_with_llguidance_and_accepts_its_example(item):
    grammar = llguidance.grammar_from("json_schema", json.dumps(item["schema"]))
    assert_llguidance_accepts(grammar, json.dumps(item["example"], separators=(",", ":")))


@pytest.mark.parametrize("item", BY_KIND["regex"], ids=lambda i: i["name"])
def test_regex_example_fullmatches_and_compiles(item):
    assert re.fullmatch(item["regex"], item["example"])
    assert output_fault(item, item["example"]) is None
    assert_llguidance_accepts(llguidance.grammar_from("regex", item["regex"]), item["example"])


@pytest.mark.parametrize("item", BY_KIND["choice"], ids=lambda i: i["name"])
def test_choice_example_is_a_choice(item):
    assert len(set(item["choice"])) == len(item["choice"]) >= 2
    assert item["example"] in item["choice"] and output_fault(item, item["example"]) is None


def test_output_fault_rejects():
    """The checker the generation tests rely on says no where it must (else every output would pass)."""
    item = BY_KIND["json"][0]
    assert output_fault(item, json.dumps(item["example"])[:-1]).startswith("not JSON")
    assert output_fault(item, "{}").startswith("invalid")
    assert output_fault(BY_KIND["regex"][0], BY_KIND["regex"][0]["example"] + "x") is not None
    assert output_fault(BY_KIND["choice"][0], BY_KIND["choice"][0]["example"].upper()) is not None
