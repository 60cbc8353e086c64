"""Text holding a lone surrogate (not a Unicode character; JSON's "\\ud800" makes one) is a ValueError naming the
prompt or chat message and the character, raised before any request is queued, not the tokenizer's bare
TypeError; the call's other prompts are not half-run, and the LLM serves them afterwards. A tiny random Llama
with a byte-level tokenizer (tests/model_executor/tiny_llama.py)."""
import os
import sys

import pytest

from fastdeploy import LLM, SamplingParams
from helpers import assert_engine_idle

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "model_executor"))
from tiny_llama import make_tiny_llama  # noqa: E402

pytestmark = pytest.mark.usefixtures("no_hang")

PARAMS = SamplingParams(temperature=0, max_tokens=4)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama_unicode")
    make_tiny_llama(path)
    return LLM(model=str(path), max_model_len=128, max_num_seqs=4)


def test_the_tokenizer_itself_raises_a_bare_type_error(llm):
    """What the check stands in front of: without it this is the error a user would see."""
    with pytest.raises(TypeError):
        llm.get_tokenizer().encode("abc\ud800", add_special_tokens=False)


@pytest.mark.parametrize("bad", ["abc\ud800", {"prompt": "x\udfffy"}])
def test_generate_names_the_prompt_and_loses_no_other(llm, bad):
    good = ["The quick brown fox", "Hello world"]
    with pytest.raises(ValueError) as raised:
        llm.generate([good[0], bad, good[1]], PARAMS, use_tqdm=False)
    message = str(raised.value)
    assert message.startswith("prompt 1 holds the lone surrogate U+"), message
    assert ("U+D800 at character 3" if isinstance(bad, str) else "U+DFFF at character 1") in message
    assert_engine_idle(llm)
    outputs = llm.generate(good, PARAMS, use_tqdm=False)
    assert [o.prompt for o in outputs] == good and all(len(o.outputs.token_ids) > 0 for o in outputs)


@pytest.mark.parametrize("content", ["hi \udc80", [{"type": "text", "text": "ok"}, {"type": "text", "text": "\ud83d"}]])
def test_chat_names_the_conversation_and_message(llm, content):
    good = [{"role": "user", "content": "Hello world"}]
    bad = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": content}]
    with pytest.raises(ValueError) as raised:
        llm.chat([good, bad], PARAMS, use_tqdm=False)
    assert str(raised.value).startswith("conversation 1, message 1: 'content' holds the lone surrogate U+"), raised.value
    assert_engine_idle(llm)
    (output,) = llm.chat([good], PARAMS, use_tqdm=False)
    assert len(output.outputs.token_ids) > 0


def test_the_input_processor_checks_text_for_every_caller(llm):
    """run_batch's workers call make_request directly: the same ValueError there."""
    with pytest.raises(ValueError, match=r"^prompt 7 holds the lone surrogate U\+D800 at character 0"):
        llm.llm_engine.make_request("\ud800", None, PARAMS, 7)
    assert_engine_idle(llm)


def test_valid_non_ascii_text_passes(llm):
    (output,) = llm.generate(["你好，世界 \U0001F600"], PARAMS, use_tqdm=False)
    assert len(output.outputs.token_ids) > 0
