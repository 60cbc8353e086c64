"""LLM(reasoning_parser=...): the engine splits each completion with the named parser."""
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.reasoning import get_reasoning_parser


@pytest.mark.parametrize("name", ["deepseek_r1", "QWEN3", ""])
def test_unknown_parser_is_rejected_before_loading(no_loading, name):
    with pytest.raises(ValueError, match=r"^reasoning_parser .*qwen3") as info:
        LLM(reasoning_parser=name)
    assert "ernie-x1" in str(info.value) and "ernie-45-vl-thinking" in str(info.value)


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("qwen3", "<think>plan</think>answer", ("plan", "answer")),
        ("ernie_x1", "abc\n</think>\n<response>hello\nworld</response>", ("abc\n", "hello\nworld")),
        ("ernie-45-vl-thinking", "all reasoning", ("all reasoning", "")),
        ("ernie-45-vl", "r</think>c", ("r", "c")),
    ],
)
def test_completion_is_split_by_the_configured_parser(smollm_llm, monkeypatch, name, text, expected):
    engine = smollm_llm.llm_engine
    processor = engine.output_processor
    monkeypatch.setattr(processor, "reasoning_parser", get_reasoning_parser(name))
    request_id = engine.enqueue(engine.make_request(None, [1, 2, 3], SamplingParams(max_tokens=2)))
    state = processor.groups[request_id].completions[0]
    state.detokenizer.text = text
    completion = processor._completion(state, [1, 2, 3])
    engine.abort_request(request_id)
    assert (completion.reasoning_content, completion.text) == expected


def test_without_a_parser_text_is_whole_and_reasoning_is_none(smollm_llm):
    out = smollm_llm.generate("Hello", SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    assert out.outputs.reasoning_content is None and out.outputs.text
