"""Structured outputs under tensor and pipeline parallelism: the masks travel with the step to the
workers and the rank that samples (rank 0; the last stage's) applies them, with up to two steps in
flight under pipeline stages (a request's mask is filled once its previous tokens came back); the
tokens equal the single-process engine's (greedy and seeded sampling) and every output satisfies
its constraint."""
import re

from fastdeploy import LLM, GuidedDecodingParams, SamplingParams
from tiny_llama import make_tiny_llama

IPV4 = r"(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])(\.(25[0-5]|2[0-4][0-9]|1?[0-9]?[0-9])){3}"
PROMPTS = [{"prompt_token_ids": ids} for ids in ([5, 6, 7, 8, 9], list(range(10, 40)), [300] * 3)]


def test_the_sampling_rank_masks_as_one_process_does(tmp_path):
    make_tiny_llama(tmp_path)
    settings = dict(model=str(tmp_path), max_model_len=128, block_size=16, max_num_seqs=4)
    params = [SamplingParams(temperature=0, max_tokens=40, guided_decoding=GuidedDecodingParams(regex=IPV4)),
              SamplingParams(n=2, temperature=0.9, seed=3, max_tokens=40,
                             guided_decoding=GuidedDecodingParams(choice=["alpha", "beta", "gamma delta"])),
              SamplingParams(temperature=0.9, seed=4, max_tokens=60,
                             guided_decoding=GuidedDecodingParams(regex=r"\[[0-9]{1,3}(, [0-9]{1,3}){0,3}\]"))]
    patterns = [IPV4, "alpha|beta|gamma delta", r"\[[0-9]{1,3}(, [0-9]{1,3}){0,3}\]"]
    results = []
    for sizes in (dict(), dict(tensor_parallel_size=2), dict(pipeline_parallel_size=2)):
        llm = LLM(**sizes, **settings)
        try:
            outs = llm.generate(PROMPTS, params, use_tqdm=False)
            results.append([[(c.token_ids, c.text, c.finish_reason) for c in o.outputs] for o in outs])
        finally:
            llm.shutdown()
    assert results[1] == results[0] and results[2] == results[0]
    for completions, pattern in zip(results[2], patterns):
        for _, text, reason in completions:
            assert reason == "stop" and re.fullmatch(pattern, text), (pattern, text)
