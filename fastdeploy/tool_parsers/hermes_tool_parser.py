"""The "hermes" tool parser."""
from fastdeploy.tool_parsers.tagged_json import TaggedJsonToolParser


class HermesToolParser(TaggedJsonToolParser):
    """Hermes 2 Pro / Nous function calling (vLLM's `hermes` parser): each call is
    `<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Paris"}}\\n</tool_call>`, several
    in a row for parallel calls, optionally after some text. Rules: TaggedJsonToolParser.

    Differences from vLLM: its content is only the text before the first block (text after the
    last block is dropped); here it is all text outside the blocks. vLLM needs "arguments"; here a
    call without it has {}. Hermes checkpoints make `<tool_call>` a special token: pass
    `SamplingParams(skip_special_tokens=False)` so the tags stay in the text (vLLM switches it off
    for such requests itself).
    """

    name = "hermes"
