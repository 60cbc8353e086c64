"""Body keys that shape what a request may output: structured outputs, logits processing, tools.

Pure data, no engine; protocol.py calls these while it parses a body (for the server and for
run-batch). Every function raises ValueError (or TypeError from the checks it shares with
`LLM.chat`) whose message names the body key, the value and what is allowed; protocol.py turns it
into a 400. The keys, their sources (OpenAI's API, vLLM's extra body keys, FastDeploy's) and what
each maps to are in docs/batch_format.md:

- `response_format`: `{"type": "text"}` (no constraint), `{"type": "json_object"}`
  (json_object=True), `{"type": "json_schema", "json_schema": {"name", "schema", "strict"?,
  "description"?}}` (json=schema; `strict: true` also sets disable_additional_properties, since
  OpenAI's strict mode admits no keys the schema does not list).
- vLLM's `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`, `guided_json_object`,
  FastDeploy's `structural_tag`, vLLM's `structured_outputs` (a dict of StructuredOutputsParams
  fields): at most one of them, and not with a JSON `response_format`.
- `guided_decoding_backend`: kept for the worker, which accepts only the LLM's own backend
  (per-request backends are not supported, vLLM's rule).
- `logit_bias` (OpenAI: token-id keys, values in [-100, 100]), vLLM's `allowed_token_ids`,
  FastDeploy's `logits_processors_args`: SamplingParams fields of the same names.
- chat only, `tools` and `tool_choice`: checked as `LLM.chat` checks them; "required" or a named
  function becomes a JSON-schema constraint (`forced_call_params`).
"""
from __future__ import annotations

import dataclasses
import json
import re
from typing import Optional

from fastdeploy.engine.sampling_params import MAX_LOGIT_BIAS, GuidedDecodingParams, SamplingParams
from fastdeploy.tool_parsers import tool_choice as tool_choices

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema")
JSON_SCHEMA_KEYS = ("name", "schema", "strict", "description")  # OpenAI's response_format.json_schema
SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for json_schema.name
# body key -> GuidedDecodingParams field (vLLM's guided_* keys, FastDeploy's structural_tag)
GUIDED_KEYS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
               "guided_grammar": "grammar", "guided_json_object": "json_object", "structural_tag": "structural_tag"}
STRUCTURED_OUTPUTS_FIELDS = tuple(f.name for f in dataclasses.fields(GuidedDecodingParams))
STRUCTURED_KEYS = ("response_format", *GUIDED_KEYS, "structured_outputs", "guided_decoding_backend")
LOGITS_KEYS = ("logit_bias", "allowed_token_ids", "logits_processors_args")
TOOL_KEYS = ("tools", "tool_choice")


def guided_decoding(body: dict) -> tuple[Optional[GuidedDecodingParams], Optional[str]]:
    """(the constraint the body asks for, the body key it came from), or (None, None).

    At most one source: a JSON `response_format`, one guided_* / structural_tag key, or
    `structured_outputs`; two or more is a ValueError naming them. `guided_json_object: false`
    counts as absent (vLLM's default)."""
    sources = {}
    if "response_format" in body:
        guided = response_format(body["response_format"])
        if guided is not None:
            sources["response_format"] = guided
    for key, name in GUIDED_KEYS.items():
        if key in body and body[key] is not False:
            value = _schema(key, body[key]) if key == "guided_json" else body[key]
            sources[key] = _guided(key, f"guided_decoding.{name}", **{name: value})
    if "structured_outputs" in body:
        sources["structured_outputs"] = structured_outputs(body["structured_outputs"])
    if len(sources) > 1:
        raise ValueError(f"more than one structured-output constraint: {sorted(sources)}; give one of "
                         f"{['response_format', *GUIDED_KEYS, 'structured_outputs']} "
                         "(response_format 'text' constrains nothing and goes with any)")
    return next(iter(sources.values()), None), next(iter(sources), None)


def response_format(value) -> Optional[GuidedDecodingParams]:
    """OpenAI's `response_format` object as a constraint (None for type "text")."""
    if not isinstance(value, dict):
        raise ValueError(f"response_format must be an object {{'type': ...}}, got {value!r}")
    kind = value.get("type")
    if kind not in RESPONSE_FORMAT_TYPES:
        raise ValueError(f"response_format.type must be one of {list(RESPONSE_FORMAT_TYPES)}, got {kind!r}")
    allowed = ("type", "json_schema") if kind == "json_schema" else ("type",)
    _no_other_keys("response_format", value, allowed)
    if kind == "text":
        return None
    if kind == "json_object":
        return GuidedDecodingParams(json_object=True)
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise ValueError("response_format.json_schema must be an object {'name', 'schema', 'strict'?, "
                         f"'description'?}} for type 'json_schema', got {spec!r}")
    _no_other_keys("response_format.json_schema", spec, JSON_SCHEMA_KEYS)
    name = spec.get("name")
    if not isinstance(name, str) or not SCHEMA_NAME.fullmatch(name):
        raise ValueError("response_format.json_schema.name must be 1 to 64 letters, digits, '_' or '-', "
                         f"got {name!r}")
    if "schema" not in spec:
        raise ValueError("response_format.json_schema.schema is missing: give the JSON schema of the output")
    if not isinstance(spec["schema"], dict):
        raise ValueError(f"response_format.json_schema.schema must be a JSON schema object, got {spec['schema']!r}")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ValueError(f"response_format.json_schema.strict must be true, false or null, got {strict!r}")
    description = spec.get("description")
    if description is not None and not isinstance(description, str):
        raise ValueError(f"response_format.json_schema.description must be a string, got {description!r}")
    return GuidedDecodingParams(json=spec["schema"], disable_additional_properties=bool(strict))


def structured_outputs(value) -> GuidedDecodingParams:
    """vLLM's `structured_outputs` body object: StructuredOutputsParams' fields by name."""
    if not isinstance(value, dict):
        raise ValueError(f"structured_outputs must be an object of {list(STRUCTURED_OUTPUTS_FIELDS)}, got {value!r}")
    _no_other_keys("structured_outputs", value, STRUCTURED_OUTPUTS_FIELDS)
    if "json" in value:
        value = {**value, "json": _schema("structured_outputs.json", value["json"])}
    return _guided("structured_outputs", "guided_decoding", **value)


def backend_name(value) -> str:
    """`guided_decoding_backend` as given (the worker compares it with the LLM's)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"guided_decoding_backend must be a non-empty string, got {value!r}")
    return value


def logit_bias(value) -> dict:
    """`logit_bias` with OpenAI's value range [-100, 100] enforced (SamplingParams would clamp);
    the keys and the value types are SamplingParams' checks."""
    if not isinstance(value, dict):
        raise ValueError(f"logit_bias must be an object {{token id: bias}}, got {value!r}")
    for key, bias in value.items():
        number = isinstance(bias, (int, float)) and not isinstance(bias, bool)
        if number and not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
            raise ValueError(f"logit_bias value of {key!r} must be in [-100, 100], got {bias}")
    return value


def tools_and_choice(body: dict) -> tuple[Optional[list], object]:
    """(tools, tool_choice) of a chat body, checked as LLM.chat checks them (messages name
    `tools[i]` or `tool_choice`)."""
    checked = tool_choices.validate_tools(body.get("tools"))
    return checked, tool_choices.validate_tool_choice(body.get("tool_choice"), checked)


def forced_call_params(params: SamplingParams, tools: Optional[list], tool_choice,
                       constraint_key: Optional[str]) -> SamplingParams:
    """`params` unchanged, or for a forcing tool_choice ("required", a named function) a copy
    whose output follows the tools' JSON schema; ValueError when the body constrains the output
    by `constraint_key` as well."""
    if not tool_choices.forces_call(tool_choice):
        return params
    if constraint_key is not None:
        raise ValueError(f"tool_choice={tool_choice!r} constrains the output to a tool call by its own JSON "
                         f"schema, and {constraint_key} constrains it too: give one or the other")
    return tool_choices.forced_params(params, tool_choices.tool_choice_schema(tools, tool_choice))


def parser_reads_calls(kind: str, tools: Optional[list], tool_choice) -> bool:
    """Whether the LLM's tool_call_parser reads this request's calls: a chat request with tools
    and tool_choice None or "auto" (OpenAI: no tools, no calls; completions have no tool calls)."""
    return kind == "chat" and bool(tools) and tool_choice in (None, "auto")


def _schema(key: str, value):
    """A JSON schema given as an object, or as JSON text holding one (vLLM accepts both)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as e:
            raise ValueError(f"{key} must be a JSON schema (an object, or JSON text of one); its text is not "
                             f"JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{key} must be a JSON schema (an object, or JSON text of one), got {value!r}")
    return value


def _guided(key: str, internal: str, **fields) -> GuidedDecodingParams:
    """GuidedDecodingParams(**fields), its error message naming `key` where it says `internal`."""
    try:
        return GuidedDecodingParams(**fields)
    except (TypeError, ValueError) as e:
        message = str(e).replace(internal, key)
        raise ValueError(message if key in message else f"{key}: {message}") from None


def _no_other_keys(where: str, value: dict, allowed) -> None:
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ValueError(f"unknown key(s) {unknown} in {where}; accepted: {list(allowed)}")
