"""tools / tool_choice of LLM.chat: validation errors, the schema that forces calls, its parse-back.

Oracle for the schema: `jsonschema` (an independent validator) on call arrays written by hand:
valid calls validate, wrong names, missing or wrong parameters fail. The parse-back is checked
against the JSON values the texts were made from.
"""
import json

import jsonschema
import pytest

from fastdeploy.tool_parsers.tool_choice import (
    forced_call_reader,
    parse_forced_calls,
    tool_choice_schema,
    validate_tool_choice,
    validate_tools,
)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"], "additionalProperties": False}}}
NOW = {"type": "function", "function": {"name": "now"}}  # no parameters
ORDER = {"type": "function", "function": {
    "name": "place_order",
    "parameters": {"type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/item"}, "minItems": 1}},
                   "required": ["items"],
                   "$defs": {"item": {"type": "object", "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                                      "required": ["sku", "qty"]}}}}}
TOOLS = [WEATHER, NOW, ORDER]


# ---- validation ------------------------------------------------------------------------------------
def test_accepted_shapes():
    assert validate_tools(None) is None and validate_tools([]) is None
    assert validate_tools(WEATHER) == [WEATHER]
    assert validate_tools(TOOLS) == TOOLS


@pytest.mark.parametrize("tools, error, message", [
    ("get_weather", TypeError, r"^tools must be None, a tool dict or a list"),
    ([WEATHER, "now"], TypeError, r"^tools\[1\] must be a dict"),
    ([{"type": "retrieval", "function": {"name": "f"}}], ValueError, r"^tools\[0\]: 'type' must be 'function', got 'retrieval'"),
    ([{"function": {"name": "f"}}], ValueError, r"^tools\[0\]: 'type' must be 'function', got None"),
    ([WEATHER, {"type": "function"}], TypeError, r"^tools\[1\]: 'function' must be a dict"),
    ([{"type": "function", "function": {"name": ""}}], ValueError, r"^tools\[0\]\.function: 'name' must be a non-empty str"),
    ([{"type": "function", "function": {"description": "d"}}], ValueError, r"^tools\[0\]\.function: 'name'"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}], TypeError, r"^tools\[0\]\.function: 'description' must be a str"),
    ([NOW, {"type": "function", "function": {"name": "f", "parameters": "{}"}}], TypeError,
     r"^tools\[1\]\.function: 'parameters' must be a JSON schema dict"),
    ([NOW, WEATHER, NOW], ValueError, r"^tools\[2\]: function name 'now' is already the name of tools\[0\]"),
])
def test_bad_tools_name_the_index_and_field(tools, error, message):
    with pytest.raises(error, match=message):
        validate_tools(tools)


@pytest.mark.parametrize("choice", [None, "auto", "none", "required", {"type": "function", "function": {"name": "now"}}])
def test_accepted_tool_choices(choice):
    assert validate_tool_choice(choice, TOOLS) == choice


@pytest.mark.parametrize("choice, tools, message", [
    ("any", TOOLS, r"^tool_choice must be one of \['auto', 'none', 'required'\]"),
    ({"type": "function", "function": {"name": "get_time"}}, TOOLS,
     r"^tool_choice names function 'get_time', which is not among the tools \['get_weather', 'now', 'place_order'\]"),
    ({"type": "function", "name": "now"}, TOOLS, r"^tool_choice as a dict must be"),
    ({"function": {"name": "now"}}, TOOLS, r"^tool_choice as a dict must be"),
    ("required", None, r"^tool_choice='required' needs tools"),
    ({"type": "function", "function": {"name": "now"}}, None, r"not among the tools \[\]"),
])
def test_bad_tool_choice(choice, tools, message):
    with pytest.raises(ValueError, match=message):
        validate_tool_choice(choice, tools)


# ---- the schema -----------------------------------------------------------------------------------
def valid(schema, value) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(value)


def test_auto_and_none_force_nothing():
    assert tool_choice_schema(TOOLS, None) is None and tool_choice_schema(TOOLS, "auto") is None
    assert tool_choice_schema(TOOLS, "none") is None


def test_required_schema_accepts_calls_of_the_tools():
    schema = tool_choice_schema(TOOLS, "required")
    jsonschema.Draft202012Validator.check_schema(schema)
    good = [
        [{"name": "get_weather", "parameters": {"city": "Paris"}}],
        [{"name": "now", "parameters": {}},
         {"name": "get_weather", "parameters": {"city": "北京", "unit": "c"}},
         {"name": "place_order", "parameters": {"items": [{"sku": "A1", "qty": 2}]}}],
    ]
    for calls in good:
        assert valid(schema, calls), calls


@pytest.mark.parametrize("calls", [
    [],  # minItems 1
    {"name": "now", "parameters": {}},  # not an array
    [{"name": "get_time", "parameters": {}}],  # unknown name
    [{"name": "get_weather"}],  # parameters missing
    [{"name": "get_weather", "parameters": {"unit": "c"}}],  # required city missing
    [{"name": "get_weather", "parameters": {"city": "Paris", "unit": "kelvin"}}],  # enum
    [{"name": "get_weather", "parameters": {"city": "Paris", "wind": True}}],  # additionalProperties false
    [{"name": "place_order", "parameters": {"items": [{"sku": "A1", "qty": 0}]}}],  # $ref'd minimum
    [{"name": "place_order", "parameters": {"items": [{"sku": "A1"}]}}],  # $ref'd required
    [{"name": "now", "parameters": "{}"}],  # parameters must be an object
])
def test_required_schema_rejects_wrong_calls(calls):
    assert not valid(tool_choice_schema(TOOLS, "required"), calls)


def test_required_schema_moves_defs_to_the_root_and_leaves_the_tools_alone():
    before = json.dumps(TOOLS, sort_keys=True)
    schema = tool_choice_schema(TOOLS, "required")
    assert schema["$defs"] == ORDER["function"]["parameters"]["$defs"]
    assert json.dumps(TOOLS, sort_keys=True) == before


def test_conflicting_defs_are_an_error():
    other = {"type": "function", "function": {"name": "other", "parameters": {
        "type": "object", "properties": {"i": {"$ref": "#/$defs/item"}}, "$defs": {"item": {"type": "string"}}}}}
    with pytest.raises(ValueError, match=r"define \$defs/item differently"):
        tool_choice_schema([ORDER, other], "required")


def test_named_function_schema_is_its_parameters():
    schema = tool_choice_schema(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    assert schema == WEATHER["function"]["parameters"]
    assert valid(schema, {"city": "Paris"}) and not valid(schema, {"unit": "c"})
    order = tool_choice_schema(TOOLS, {"type": "function", "function": {"name": "place_order"}})
    assert valid(order, {"items": [{"sku": "x", "qty": 1}]}) and not valid(order, {"items": [{"sku": "x", "qty": 0}]})
    anything = tool_choice_schema(TOOLS, {"type": "function", "function": {"name": "now"}})
    assert valid(anything, {}) and not valid(anything, [])


# ---- parse-back ------------------------------------------------------------------------------------
def names_and_arguments(calls):
    return [(c.function.name, json.loads(c.function.arguments)) for c in calls]


def test_required_output_parses_into_calls():
    value = [{"name": "get_weather", "parameters": {"city": "東京"}}, {"name": "now", "parameters": {}}]
    text = json.dumps(value, ensure_ascii=False, indent=1)
    assert valid(tool_choice_schema(TOOLS, "required"), json.loads(text))
    calls, left = parse_forced_calls(text, "required")
    assert names_and_arguments(calls) == [("get_weather", {"city": "東京"}), ("now", {})] and left == ""
    assert "東京" in calls[0].function.arguments


def test_named_output_parses_into_one_call():
    choice = {"type": "function", "function": {"name": "get_weather"}}
    calls, left = parse_forced_calls('{"city": "Paris", "unit": "f"}', choice)
    assert names_and_arguments(calls) == [("get_weather", {"city": "Paris", "unit": "f"})] and left == ""


def test_thinking_before_the_forced_json_stays_in_the_text():
    calls, left = parse_forced_calls('<think>\nplan\n</think>\n\n[{"name": "now", "parameters": {}}]', "required")
    assert names_and_arguments(calls) == [("now", {})] and left == "<think>\nplan\n</think>"


@pytest.mark.parametrize("text, choice", [
    ('[{"name": "now", "parameters": {', "required"),  # cut off by max_tokens
    ("[]", "required"),
    ('{"name": "now", "parameters": {}}', "required"),
    ('[{"name": "now"}]', "required"),
    ('["now"]', "required"),
    ('["city"]', {"type": "function", "function": {"name": "get_weather"}}),
    ("", {"type": "function", "function": {"name": "get_weather"}}),
])
def test_output_that_is_not_the_forced_json_gives_no_calls(text, choice):
    assert parse_forced_calls(text, choice) == (None, text)


def test_forced_call_reader_reads_the_answer_after_the_thinking():
    read = forced_call_reader("required")
    full = 'plan\n</think>\n\n[{"name": "now", "parameters": {}}]'
    # a reasoning parser split "plan\n" off and kept no answer (ernie-x1 keeps only <response> text)
    calls, text = read(full, "plan\n", "")
    assert names_and_arguments(calls) == [("now", {})] and text == ""
    calls, text = read(full, None, full)  # no reasoning parser: the thinking stays in the text
    assert names_and_arguments(calls) == [("now", {})] and text == "plan\n</think>"
    assert read("plan\n</think>\n\n[{", "plan\n", "[{") == (None, "[{")  # cut off: the answer as it was
