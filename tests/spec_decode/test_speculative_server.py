"""The API server with `--speculative-config`: the greedy answers of LLM without speculation, and the
draft counters on /metrics."""
import json

import httpx
import openai
from prometheus_client.parser import text_string_to_metric_families

from fastdeploy import SamplingParams
from prompts import conversations
from running_server import RunningServer


def counters(server) -> dict:
    text = httpx.get(server.url + "/metrics").text
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith("fastdeploy:spec_decode")}


def test_server_speculates_and_counts_drafts(smollm_llm, smollm_path):
    spec = json.dumps({"method": "ngram", "num_speculative_tokens": 4})
    convs = conversations()[:2]
    expected = smollm_llm.chat(convs, SamplingParams(temperature=0, max_tokens=40), use_tqdm=False)
    with RunningServer("--max-model-len", "1024", "--speculative-config", spec) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
        texts = [client.chat.completions.create(model=server.model, messages=conv, temperature=0, max_tokens=40)
                 .choices[0].message.content for conv in convs]
        stream = client.chat.completions.create(model=server.model, messages=convs[0], temperature=0, max_tokens=40,
                                                stream=True)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        found = counters(server)
    assert texts == [o.outputs.text for o in expected]
    assert streamed == texts[0]  # several tokens a step arrive as one delta, none lost
    accepted = found["fastdeploy:spec_decode_num_accepted_tokens_total"]
    assert 0 < accepted <= found["fastdeploy:spec_decode_num_draft_tokens_total"]
