"""The "qwen3" tool parser."""
from fastdeploy.tool_parsers.hermes_tool_parser import HermesToolParser


class Qwen3ToolParser(HermesToolParser):
    """Qwen3 (and Qwen2.5) instruct models: the Hermes format, which their chat templates ask
    for (`For each function call, return a json object with function name and arguments within
    <tool_call></tool_call> XML tags`) and Qwen's docs serve with vLLM's `hermes` parser. With
    thinking on, the calls follow `</think>`; a `<tool_call>` inside the thinking is no call.
    `<tool_call>` is an ordinary added token of their tokenizers, so it stays in the text.
    Qwen3-Coder's XML call format (`<function=...>`) is a different parser, not this one.
    """

    name = "qwen3"
