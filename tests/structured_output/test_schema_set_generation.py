"""Every item of the structured-output schema set (benchmarks/structured_schemas.json: >= 24 JSON
schemas shaped like API payloads, regexes, choices) generated on the default model under its
constraint, greedy and sampled with n = 2: every output finishes by itself and satisfies the item
(jsonschema validation, re.fullmatch, exact choice: the benchmark's `output_fault`)."""
import sys
from pathlib import Path

import pytest
from helpers import chat

from fastdeploy import GuidedDecodingParams, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from benchmark_structured import SYSTEM, constraint, load_items, output_fault  # noqa: E402

ITEMS = load_items()
MAX_TOKENS = 800  # greedy runs of the default model fill arrays to maxItems with pretty-printed JSON: up to ~600 tokens


def conversation(item):
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": item["prompt"]}]


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_every_item_of_the_schema_set_is_satisfied(smollm_llm, mode):
    if mode == "greedy":
        params = [SamplingParams(temperature=0, max_tokens=MAX_TOKENS,
                                 guided_decoding=GuidedDecodingParams(**constraint(item))) for item in ITEMS]
    else:
        params = [SamplingParams(n=2, temperature=0.7, top_p=0.9, seed=100 + i, max_tokens=MAX_TOKENS,
                                 guided_decoding=GuidedDecodingParams(**constraint(item)))
                  for i, item in enumerate(ITEMS)]
    outs = chat(smollm_llm, [conversation(item) for item in ITEMS], params)
    faults = []
    for item, out in zip(ITEMS, outs):
        for c in (out.outputs if isinstance(out.outputs, list) else [out.outputs]):
            fault = "hit max_tokens" if c.finish_reason != "stop" else output_fault(item, c.text)
            if fault:
                faults.append(f"{item['name']}: {fault}: {c.text[:200]!r}")
    assert not faults, "\n".join(faults)
