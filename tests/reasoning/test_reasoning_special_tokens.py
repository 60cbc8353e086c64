"""Reasoning parsers when their tags are *special* tokens (dropped by skip_special_tokens=True).

The tokenizer here is a tiny byte-level BPE (one token per byte, no merges) with `<think>`,
`</think>`, `<tool_call>` and `<|im_end|>` added as special tokens and `<response>`/`</response>`
as ordinary added tokens, wrapped in transformers' PreTrainedTokenizerFast. Expected splits are
written out by hand from each parser's documented rules (FastDeploy 2.3's), with the special tags
absent from both fields as `skip_special_tokens=True` asks.
"""
import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from fastdeploy import SamplingParams
from fastdeploy.output.stop_checker import append_token
from fastdeploy.reasoning import get_reasoning_parser

SPECIAL = ("<think>", "</think>", "<tool_call>", "<|im_end|>")
ORDINARY_ADDED = ("<response>", "</response>")


@pytest.fixture(scope="module")
def tokenizer():
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ORDINARY_ADDED])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")


def encode(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_the_fixture_drops_the_tags_from_skipped_text(tokenizer):
    """The premise: a text-only split sees no tags at all."""
    ids = encode(tokenizer, "<think>plan</think>answer")
    assert len(ids) == len("plananswer") + 2 and ids[0] == tokenizer.convert_tokens_to_ids("<think>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "plananswer"
    assert get_reasoning_parser("qwen3").extract("plananswer") == (None, "plananswer")


CASES = [
    # (parser, completion as the model wrote it, expected (reasoning_content, content))
    ("qwen3", "<think>plan it</think>the answer<|im_end|>", ("plan it", "the answer")),
    ("qwen3", "<think>\nplan\n</think>\n\nanswer", ("\nplan\n", "\n\nanswer")),
    ("qwen3", "plan\n</think>\n\nanswer ", ("plan", "answer")),
    ("qwen3", "no tags at all", (None, "no tags at all")),
    ("qwen3", "<think>still thinking", (None, "still thinking")),
    ("qwen3", "<think>caf\u00e9</think>\u00fcber", ("caf\u00e9", "\u00fcber")),
    ("ernie-45-vl", "<think>abc</think>xyz", ("abc", "xyz")),
    ("ernie-45-vl", "abc</think>\n\nxyz<|im_end|>", ("abc", "\n\nxyz")),
    ("ernie-45-vl-thinking", "reasoning</think>\n<tool_call>{\"a\": 1}", ("reasoning", "")),
    ("ernie-45-vl-thinking", "r</think>\nLet me check.\n<tool_call>x", ("r", "\nLet me check.\nx")),
    ("ernie-45-vl-thinking", "all reasoning", ("all reasoning", "")),
    ("ernie-x1", "abc\n</think>\n<response>hello\nworld</response><|im_end|>", ("abc\n", "hello\nworld")),
    ("ernie-x1", "abc</think><tool_call>call<response>hi</response>", ("abc", "")),
]


@pytest.mark.parametrize("name, completion, expected", CASES)
def test_split_on_token_ids_with_special_tags(tokenizer, name, completion, expected):
    ids = encode(tokenizer, completion)
    text = tokenizer.decode(ids, skip_special_tokens=True)  # what `CompletionOutput.text` holds
    parser = get_reasoning_parser(name)
    assert parser.extract_from_tokens(text, ids, tokenizer, skip_special_tokens=True) == expected


@pytest.mark.parametrize("name, completion", [(n, c) for n, c, _ in CASES])
def test_with_special_tokens_kept_the_text_split_is_unchanged(tokenizer, name, completion):
    ids = encode(tokenizer, completion)
    text = tokenizer.decode(ids, skip_special_tokens=False)
    parser = get_reasoning_parser(name)
    assert parser.extract_from_tokens(text, ids, tokenizer, skip_special_tokens=False) == parser.extract(text)


def test_text_cut_at_a_stop_string_keeps_only_tags_before_the_cut(tokenizer):
    ids = encode(tokenizer, "<think>plan</think>answer STOP<think>late")
    parser = get_reasoning_parser("qwen3")
    assert parser.extract_from_tokens("plananswer ", ids, tokenizer, True) == ("plan", "answer ")


def test_a_text_that_is_not_the_ids_decoding_falls_back_to_the_text_split(tokenizer):
    ids = encode(tokenizer, "<think>plan</think>answer")
    parser = get_reasoning_parser("ernie-45-vl")
    assert parser.extract_from_tokens("other</think>words", ids, tokenizer, True) == ("other", "words")


def test_a_literal_tag_made_of_ordinary_tokens_is_kept_without_special_tags(tokenizer):
    ids = [i for ch in "a</think>b" for i in encode(tokenizer, ch)]  # byte by byte: no special token
    assert tokenizer.convert_tokens_to_ids("</think>") not in ids
    parser = get_reasoning_parser("ernie-45-vl")
    assert parser.extract_from_tokens("a</think>b", ids, tokenizer, True) == ("a", "b")


# ---- through the engine's output path (the default model's engine, its tokenizer swapped) -------------
@pytest.fixture
def engine_with_tiny_tokenizer(smollm_llm, tokenizer, monkeypatch):
    engine = smollm_llm.llm_engine
    monkeypatch.setattr(engine, "tokenizer", tokenizer)
    monkeypatch.setattr(engine.output_processor, "tokenizer", tokenizer)
    return engine


def _finish(engine, completion, tokenizer, **params):
    """Feed the completion's ids through append_token (detokenizer, stops) and build the output."""
    ids = encode(tokenizer, completion)
    prompt = encode(tokenizer, "Question?")
    request_id = engine.enqueue(engine.make_request(None, prompt, SamplingParams(max_tokens=len(ids), **params)))
    processor = engine.output_processor
    state = processor.groups[request_id].completions[0]
    for token_id in ids:
        if append_token(state, token_id):
            break
    output = processor._completion(state, prompt)
    engine.abort_request(request_id)
    return output


@pytest.mark.parametrize(
    "name, completion, params, expected",
    [
        ("qwen3", "<think>plan it</think>the answer<|im_end|>", {}, ("plan it", "the answer")),
        ("ernie-45-vl", "abc</think>xyz STOP more", {"stop": ["STOP"]}, ("abc", "xyz ")),
        ("ernie-x1", "r</think>\n<response>ok</response><|im_end|>", {"skip_special_tokens": False},
         ("r", "ok")),
    ],
)
def test_engine_completion_splits_at_special_tags(engine_with_tiny_tokenizer, tokenizer, monkeypatch,
                                                  name, completion, params, expected):
    engine = engine_with_tiny_tokenizer
    monkeypatch.setattr(engine.output_processor, "reasoning_parser", get_reasoning_parser(name))
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    output = _finish(engine, completion, tokenizer, stop_token_ids=[eos], **params)
    assert (output.reasoning_content, output.text) == expected
    assert output.token_ids == encode(tokenizer, completion)[: len(output.token_ids)]
