"""The "ernie-45-vl-thinking" tool parser."""
from fastdeploy.tool_parsers.tagged_json import TaggedJsonToolParser


class Ernie45VLThinkingToolParser(TaggedJsonToolParser):
    """ERNIE-4.5-VL-28B-A3B-Thinking (FastDeploy's `--tool-call-parser ernie-45-vl-thinking`):
    `reasoning</think>\\n\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

    Rules: TaggedJsonToolParser, plus FastDeploy's rule for this model
    (`Ernie45VLThinkingToolParser.extract_tool_calls`): the calls must open the answer, only
    newlines before the first `<tool_call>`; an answer that starts with other text is a plain
    answer (no call), even if it later holds a block. FastDeploy also recovers the name and the
    parsed part of a block whose JSON is cut off (partial_json_parser) and then reports
    tools_called False; here such a block is simply no call.
    """

    name = "ernie-45-vl-thinking"

    def accepts(self, before_first_call: str) -> bool:
        return not before_first_call.strip("\n")
