"""logit_bias, allowed_token_ids and FastDeploy's LogitBiasLogitsProcessor under tensor parallelism:
rank 0, which samples, applies them, and the tokens equal the single-process engine's (seeded
sampling draws the same numbers at any rank count)."""
from fastdeploy import LLM, SamplingParams
from tiny_llama import make_tiny_llama

PROMPTS = [{"prompt_token_ids": ids} for ids in ([5, 6, 7, 8, 9], list(range(10, 40)), [300] * 3)]


def test_rank_0_processes_the_logits_as_one_process_does(tmp_path):
    make_tiny_llama(tmp_path)
    settings = dict(model=str(tmp_path), max_model_len=128, block_size=16, max_num_seqs=4,
                    logits_processors=["LogitBiasLogitsProcessor"])
    params = [SamplingParams(temperature=0.8, seed=3, max_tokens=8, ignore_eos=True, logit_bias={7: 3.0, 11: -2.0}),
              SamplingParams(temperature=0.8, seed=4, max_tokens=8, ignore_eos=True, allowed_token_ids=[5, 6, 7, 300]),
              SamplingParams(temperature=0.8, seed=5, max_tokens=8, ignore_eos=True,
                             logits_processors_args={"logit_bias": {9: 100.0}})]
    tokens = []
    for size in (1, 2):
        llm = LLM(tensor_parallel_size=size, **settings)
        try:
            tokens.append([o.outputs.token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)])
        finally:
            llm.shutdown()
    assert tokens[1] == tokens[0]
    assert set(tokens[1][1]) <= {5, 6, 7, 300} and tokens[1][2] == [9] * 8
