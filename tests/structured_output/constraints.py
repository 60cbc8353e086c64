"""Shared by the structured-output tests: constraints the default model can satisfy within a few
hundred tokens, and JSON checks that do not trust our own output."""
import json

# bounded strings and arrays: a completion under this schema always fits max_tokens=200
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z]{1,12}@[a-z]{1,12}\\.com$"},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "manager": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/ref"}]},
    },
    "required": ["name", "age", "email", "role", "tags", "manager"],
    "additionalProperties": False,
    "$defs": {"ref": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 1, "maximum": 999}},
                      "required": ["id"], "additionalProperties": False}},
}
PERSON_CHAT = [{"role": "user", "content": "Write a JSON record of an employee: name, age, email, role, tags, "
                                            "manager."}]
IPV4 = r"(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){3}"


def validate_json(text: str, schema: dict):
    """The parsed value; fails the test unless `text` is one JSON value valid under `schema`."""
    import jsonschema

    value = json.loads(text)
    jsonschema.validate(value, schema)
    return value


def whitespace_runs_outside_strings(text: str) -> list[str]:
    """The runs of whitespace between JSON tokens (outside string literals) of JSON `text`."""
    runs, current, in_string, escaped = [], "", False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
            continue
        if ch in " \t\r\n":
            current += ch
            continue
        if current:
            runs.append(current)
            current = ""
        in_string = ch == '"'
    if current:
        runs.append(current)
    return runs

