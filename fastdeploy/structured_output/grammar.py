"""A request's constraint as the backends take it: `GrammarSpec`, built from its GuidedDecodingParams.

The spec is hashable and canonical (a JSON schema is re-serialised in one layout, its key order
kept: both backends emit an object's properties in the order the schema declares them), so it keys
the compiled-grammar cache: two requests with the same constraint written differently share one entry.

Whitespace between JSON tokens (`WHITESPACE_BOUNDED`, the default): one space, or one newline and up
to 20 spaces of indentation, per gap. JSON's own grammar allows any run of whitespace there, and a
small model held to a schema often emits newlines until max_tokens; the cap still admits compact
output (`{"a": 1}`) and indented output up to ten levels of two spaces. `disable_any_whitespace`
(per request, or `LLM(guided_decoding_disable_any_whitespace=True)`) allows none (`{"a":1}`); a
request's `whitespace_pattern` replaces the default.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from fastdeploy.engine.sampling_params import GuidedDecodingParams

WHITESPACE_BOUNDED = r"(?:\n[ ]{0,20}| )?"
STRUCTURAL_TAG_FORM = 'must be JSON of the form {"structures": [{"begin", "schema", "end"}], "triggers": [...]}'
JSON_OBJECT_SCHEMA = '{"type": "object"}'  # OpenAI's json_object: any JSON object


@dataclass(frozen=True)
class GrammarSpec:
    """One constraint, canonical and hashable.

    Attributes:
        kind: "json", "regex", "choice", "grammar" or "structural_tag" (json_object is "json" with
            JSON_OBJECT_SCHEMA).
        source: the schema as canonical JSON text, the regex, the choices as a JSON list, the
            grammar text, or the structural tag's JSON text.
        whitespace: the regex of whitespace allowed between JSON tokens; "" = none.
    """

    kind: str
    source: str
    whitespace: str = WHITESPACE_BOUNDED

    def describe(self) -> str:
        """`guided_decoding.<kind>` as users name it, for error messages."""
        return f"guided_decoding.{self.kind}"


def grammar_spec(params: Optional[GuidedDecodingParams], disable_any_whitespace: bool = False) -> Optional[GrammarSpec]:
    """The spec of `params`, or None when no kind is set. Raises ValueError when `json` is text that
    does not parse as JSON, or is not a JSON object."""
    kind = params.kind if params is not None else None
    if kind is None:
        return None
    whitespace = "" if disable_any_whitespace or params.disable_any_whitespace else WHITESPACE_BOUNDED
    if params.whitespace_pattern is not None:
        whitespace = params.whitespace_pattern
    if kind in ("json", "json_object"):
        schema = _schema(params.json) if kind == "json" else json.loads(JSON_OBJECT_SCHEMA)
        if params.disable_additional_properties:
            schema = _closed_objects(schema)
        return GrammarSpec("json", _json_text(schema), whitespace)
    if kind == "choice":
        return GrammarSpec("choice", json.dumps(params.choice, ensure_ascii=False))
    return GrammarSpec(kind, getattr(params, kind))


def _schema(schema) -> dict:
    """The schema as a dict (a str is parsed); ValueError unless it is a JSON object."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as error:
            raise ValueError(f"guided_decoding.json is not valid JSON: {error}") from None
    if not isinstance(schema, dict):
        raise ValueError(f"guided_decoding.json must be a JSON schema object, got {type(schema).__name__}")
    return schema


def _json_text(schema: dict) -> str:
    """The schema's JSON text; ValueError when it holds something JSON cannot hold."""
    try:
        return json.dumps(schema, ensure_ascii=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"guided_decoding.json cannot be serialised as JSON: {error}") from None


def structural_tag_parts(source: str) -> tuple[list[dict], list]:
    """(structures, each {"begin", "schema", "end"}; triggers) of a structural tag's JSON text, for
    the backends to build their own tags from; ValueError naming the expected form."""
    try:
        tag = json.loads(source)
        structures = [{"begin": s["begin"], "schema": s["schema"], "end": s["end"]} for s in tag["structures"]]
        triggers = tag["triggers"]
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise ValueError(f"{STRUCTURAL_TAG_FORM} ({type(error).__name__}: {error})") from None
    if not structures:
        raise ValueError("has no structures")
    return structures, triggers


def _closed_objects(node):
    """A copy of a schema where every object schema without `additionalProperties` gets `false`
    (vLLM's disable_additional_properties)."""
    if isinstance(node, list):
        return [_closed_objects(item) for item in node]
    if not isinstance(node, dict):
        return node
    closed = {key: _closed_objects(value) for key, value in node.items()}
    if (closed.get("type") == "object" or "properties" in closed) and "additionalProperties" not in closed:
        closed["additionalProperties"] = False
    return closed
