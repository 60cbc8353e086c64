"""Metadata fields of a GGUF file as Python values (read by the model loader and the GGUF tokenizer)."""
from typing import Any

import gguf


def gguf_metadata_value(reader: "gguf.GGUFReader", key: str, default: Any = None) -> Any:
    """The value of metadata field ``key`` as a Python object, or ``default`` if absent.

    Strings (stored as uint8 arrays) become ``str``, numbers ``int``/``float``, booleans ``bool``,
    arrays a flat ``list`` of those.
    """
    field = reader.fields.get(key)
    if field is None:
        return default
    kind = field.types[0]
    if kind == gguf.GGUFValueType.ARRAY:
        # An empty array records no element type, so ``types[-1]`` is then ARRAY itself.
        if field.types[-1] == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [value for i in field.data for value in field.parts[i].tolist()]
    if kind == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    return field.parts[field.data[0]].tolist()[0]
