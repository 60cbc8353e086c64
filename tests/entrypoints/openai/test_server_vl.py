"""A real API server on the tiny ERNIE-4.5-VL checkpoint (tests/vl_helpers.py): a chat whose
message holds an `image_url` part (a data: URL), streamed and not.

Oracle: `LLM.chat` in this process on the same checkpoint and image (the offline VL path, which
tests/vl checks against transformers): the same prompt token count and the same greedy text.
"""
import base64
import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from running_server import RunningServer
from vl_helpers import build_tiny_vl

ENGINE_ARGS = dict(max_model_len=512, max_num_seqs=4, block_size=16, num_gpu_blocks_override=64)
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return build_tiny_vl(tmp_path_factory.mktemp("tiny_vl"), template="fd")


@pytest.fixture(scope="module")
def server(checkpoint):
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE_ARGS.items()]
    with RunningServer("--model", str(checkpoint), "--served-model-name", "vl", *flags, model="vl") as s:
        yield s


@pytest.fixture(scope="module")
def messages():
    pixels = (np.random.RandomState(0).rand(60, 90, 3) * 255).astype("uint8")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "Describe the picture."}]}]


@pytest.fixture(scope="module")
def offline(checkpoint, messages):
    from fastdeploy import LLM, SamplingParams

    llm = LLM(model=str(checkpoint), **ENGINE_ARGS)
    try:
        return llm.chat(messages, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)[0]
    finally:
        llm.shutdown()


def test_image_chat_streamed_and_not_equals_offline(server, messages, offline):
    client = server.client(timeout=60)
    body = client.chat.completions.create(model="vl", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    assert body.usage.prompt_tokens == len(offline.prompt_token_ids)
    assert body.usage.completion_tokens == len(offline.outputs.token_ids)
    assert body.choices[0].message.content == offline.outputs.text
    chunks = list(client.chat.completions.create(model="vl", messages=messages, max_tokens=MAX_TOKENS, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == offline.outputs.text
    assert chunks[-1].usage.prompt_tokens == len(offline.prompt_token_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == \
        [offline.outputs.finish_reason]
