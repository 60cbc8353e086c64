"""Structured outputs under tensor parallelism: the masks travel with the step to the workers and
rank 0, which samples, applies them; the tokens equal the single-process engine's (greedy and seeded
sampling) and every output satisfies its constraint."""
import re

from fastdeploy import LLM, GuidedDecodingParams, SamplingParams
from tiny_llama import make_tiny_llama

IPV4 = r"(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){3}"
PROMPTS = [{"prompt_token_ids": ids} for ids in ([5, 6, 7, 8, 9], list(range(10, 40)), [300] * 3)]


def test_rank_0_masks_as_one_process_does(tmp_path):
    make_tiny_llama(tmp_path)
    settings = dict(model=str(tmp_path), max_model_len=128, block_size=16, max_num_seqs=4)
    params = [SamplingParams(temperature=0, max_tokens=40, guided_decoding=GuidedDecodingParams(regex=IPV4)),
              SamplingParams(n=2, temperature=0.9, seed=3, max_tokens=40,
                             guided_decoding=GuidedDecodingParams(choice=["alpha", "beta", "gamma delta"])),
              SamplingParams(temperature=0.9, seed=4, max_tokens=60,
                             guided_decoding=GuidedDecodingParams(regex=r"\[[0-9]{1,3}(, [0-9]{1,3}){0,3}\]"))]
    patterns = [IPV4, "alpha|beta|gamma delta", r"\[[0-9]{1,3}(, [0-9]{1,3}){0,3}\]"]
    results = []
    for size in (1, 2):
        llm = LLM(tensor_parallel_size=size, **settings)
        try:
            outs = llm.generate(PROMPTS, params, use_tqdm=False)
            results.append([[(c.token_ids, c.text, c.finish_reason) for c in o.outputs] for o in outs])
        finally:
            llm.shutdown()
    assert results[1] == results[0]
    for completions, pattern in zip(results[1], patterns):
        for _, text, reason in completions:
            assert reason == "stop" and re.fullmatch(pattern, text), (pattern, text)
