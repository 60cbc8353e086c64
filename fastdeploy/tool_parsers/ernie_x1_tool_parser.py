"""The "ernie-x1" tool parser."""
from fastdeploy.tool_parsers.tagged_json import TaggedJsonToolParser


class ErnieX1ToolParser(TaggedJsonToolParser):
    """ERNIE-4.5-21B-A3B-Thinking (FastDeploy's `--tool-call-parser ernie-x1`): the model thinks,
    then writes `</think>\\n\\n<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>\\n`
    (one block per call) or `<response>answer</response>`. Rules: TaggedJsonToolParser.

    As FastDeploy's `ErnieX1ToolParser.extract_tool_calls`: a block body is a JSON object, a missing
    "arguments" is {}, and any block that fails to parse leaves the completion uncalled with its
    text kept. FastDeploy reads only closed blocks and returns no content with calls; here an
    unclosed last block with complete JSON counts too, and the content is the text outside the
    blocks (the model's `<response>` text, if it wrote one beside its calls).
    """

    name = "ernie-x1"
