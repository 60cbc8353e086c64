"""`tools` and `tool_choice` of a chat call: validation, the schema that forces a call, its parse-back.

Accepted `tools` (FastDeploy's shapes, OpenAI's fields): None, one tool dict, or a list of them,
each `{"type": "function", "function": {"name": str, "description": str?, "parameters": dict?}}`;
an empty list is None. `tool_choice` (OpenAI's values):
- None or "auto": the model may call; the engine's tool_call_parser reads the calls.
- "none": tools are rendered, nothing is parsed.
- "required": the output is forced (guided decoding, vLLM's way) to a JSON array of one or more
  `{"name": tool name, "parameters": that tool's arguments}` (`tool_choice_schema`).
- `{"type": "function", "function": {"name": ...}}`: the output is forced to that function's
  arguments object.
For the forced kinds the output's JSON is read back into calls by `parse_forced_calls` (the output
processor calls `forced_call_reader(tool_choice)` in place of the tool_call_parser), as vLLM does.
"""
from __future__ import annotations

import copy
import json
from typing import Optional, Union

from fastdeploy.engine.request import ToolCall
from fastdeploy.engine.sampling_params import GuidedDecodingParams, SamplingParams
from fastdeploy.reasoning.base import THINK_END
from fastdeploy.tool_parsers.base import answer_part

TOOL_CHOICE_MODES = ("auto", "none", "required")
EMPTY_PARAMETERS = {"type": "object", "properties": {}}
DEFS_KEY = "$defs"


def validate_tools(tools) -> Optional[list[dict]]:
    """The tools as a list (None for None or []); TypeError/ValueError naming `tools[i]` and the
    field otherwise. Names must be unique."""
    if tools is None:
        return None
    if isinstance(tools, dict):
        tools = [tools]
    if not isinstance(tools, (list, tuple)):
        raise TypeError(f"tools must be None, a tool dict or a list of them, got {type(tools).__name__}")
    names = {}
    for i, tool in enumerate(tools):
        name = _validate_tool(tool, f"tools[{i}]")
        if name in names:
            raise ValueError(f"tools[{i}]: function name {name!r} is already the name of tools[{names[name]}]; "
                             "names must be unique")
        names[name] = i
    return list(tools) or None


def _validate_tool(tool, where: str) -> str:
    if not isinstance(tool, dict):
        raise TypeError(f"{where} must be a dict {{'type': 'function', 'function': {{...}}}}, got {type(tool).__name__}")
    if tool.get("type") != "function":
        raise ValueError(f"{where}: 'type' must be 'function', got {tool.get('type')!r}")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise TypeError(f"{where}: 'function' must be a dict with 'name', 'description'?, 'parameters'?, "
                        f"got {type(function).__name__}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.function: 'name' must be a non-empty str, got {name!r}")
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise TypeError(f"{where}.function: 'description' must be a str, got {type(description).__name__}")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise TypeError(f"{where}.function: 'parameters' must be a JSON schema dict, got {type(parameters).__name__}")
    return name


def validate_tool_choice(tool_choice, tools: Optional[list[dict]]) -> Union[str, dict, None]:
    """`tool_choice` checked against the validated `tools`: ValueError for an unknown value, a
    named function that is not among the tools, or "required"/a named function without tools."""
    if tool_choice is None or tool_choice in TOOL_CHOICE_MODES:
        if tool_choice == "required" and not tools:
            raise ValueError("tool_choice='required' needs tools")
        return tool_choice
    if not isinstance(tool_choice, dict):
        raise ValueError(f"tool_choice must be one of {list(TOOL_CHOICE_MODES)}, None or "
                         f"{{'type': 'function', 'function': {{'name': ...}}}}, got {tool_choice!r}")
    function = tool_choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if tool_choice.get("type") != "function" or not isinstance(name, str):
        raise ValueError(f"tool_choice as a dict must be {{'type': 'function', 'function': {{'name': str}}}}, "
                         f"got {tool_choice!r}")
    known = [tool["function"]["name"] for tool in tools or ()]
    if name not in known:
        raise ValueError(f"tool_choice names function {name!r}, which is not among the tools {known}")
    return tool_choice


def forces_call(tool_choice) -> bool:
    """Whether `tool_choice` constrains the output to calls ("required" or a named function)."""
    return tool_choice == "required" or isinstance(tool_choice, dict)


def tool_choice_schema(tools: list[dict], tool_choice) -> Optional[dict]:
    """The JSON schema the output must follow for a validated `tool_choice`, or None (auto, none).

    "required": `{"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [one per
    tool: {"properties": {"name": {"type": "string", "enum": [its name]}, "parameters": its
    parameters schema}, "required": ["name", "parameters"], "additionalProperties": false}]}}` (vLLM's
    schema, with the call objects closed: a call holds its name and parameters, nothing else, which
    keeps a small model from inventing keys); the tools' `$defs` are moved to
    the root (a `#/$defs/...` reference is read from the root), a name defined differently by two
    tools is a ValueError. A named function: that function's parameters schema (a tool without
    one takes any object).
    """
    if not forces_call(tool_choice):
        return None
    by_name = {tool["function"]["name"]: tool["function"] for tool in tools}
    if isinstance(tool_choice, dict):
        return copy.deepcopy(by_name[tool_choice["function"]["name"]].get("parameters") or EMPTY_PARAMETERS)
    defs, variants = {}, []
    for name, function in by_name.items():
        parameters = copy.deepcopy(function.get("parameters") or EMPTY_PARAMETERS)
        for key, definition in parameters.pop(DEFS_KEY, {}).items():
            if key in defs and defs[key] != definition:
                raise ValueError(f"tools define {DEFS_KEY}/{key} differently (function {name!r} and an earlier "
                                 "one); tool_choice='required' puts all definitions in one schema")
            defs[key] = definition
        variants.append({"properties": {"name": {"type": "string", "enum": [name]}, "parameters": parameters},
                         "required": ["name", "parameters"], "additionalProperties": False})
    schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": variants}}
    if defs:
        schema[DEFS_KEY] = defs
    return schema


def forced_params(params: SamplingParams, schema: dict) -> SamplingParams:
    """A copy of `params` whose output follows `schema` (a `tool_choice_schema`): its guided_decoding
    under both of the field's names."""
    guided = GuidedDecodingParams(json=schema)
    return params.clone(guided_decoding=guided, structured_outputs=guided)


def parse_forced_calls(text: str, tool_choice) -> tuple[Optional[list[ToolCall]], str]:
    """(calls, text left) of an output forced by `tool_choice_schema` ("required" or a named
    function). The JSON is read after the thinking (`</think>`, when the text has one); the text
    left is the thinking before it (stripped; "" without one). (None, text) when that is not the
    expected JSON (e.g. cut off by max_tokens)."""
    thinking, end, answer = text.partition(THINK_END)
    if not end:
        thinking, answer = "", text
    try:
        value = json.loads(answer)
    except ValueError:
        return None, text
    left = (thinking + end).strip()
    if isinstance(tool_choice, dict):
        return ([ToolCall.of(tool_choice["function"]["name"], value)], left) if isinstance(value, dict) else (None, text)
    if not isinstance(value, list) or not value or not all(
            isinstance(c, dict) and isinstance(c.get("name"), str) and isinstance(c.get("parameters"), dict)
            for c in value):
        return None, text
    return [ToolCall.of(c["name"], c["parameters"]) for c in value], left


def forced_call_reader(tool_choice):
    """The output processor's tool-call step for a forced `tool_choice` (OutputProcessor
    `set_tool_call_reader`): (text, reasoning_content, answer) -> (calls, new text), the JSON read
    in the answer after the thinking (whatever the reasoning parser kept as its answer: ernie-x1's
    keeps only `<response>` text); (None, answer) when it is not the forced JSON."""

    def read(text: str, reasoning_content: Optional[str], answer: str):
        calls, left = parse_forced_calls(answer_part(text, reasoning_content), tool_choice)
        return (calls, left) if calls is not None else (None, answer)

    return read
