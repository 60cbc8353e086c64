"""LLM(use_warmup=1): a real warm-up step at start-up that leaves nothing behind.

Checked: the steps it runs (a spy on the executor: one prefill filling the token budget as far as
the pool holds it, then one decode of max_num_seqs rows); afterwards an idle engine with every block
free, the prefix cache holding none of its prompts, request ids from "0", and the same tokens as an
engine built without it, for greedy, seeded and unseeded (engine-seeded) sampling.
"""
import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.engine.warmup import GENERATED, warm_up, warmup_prompts, warmup_shape
from fastdeploy.executor import InProcessExecutor

from helpers import assert_engine_idle
from tiny_checkpoints import make_checkpoint

# 4 sequences, pool of 63 usable 16-token blocks: 15 blocks (240 tokens) each, 238 + 2 generated
KWARGS = dict(max_model_len=256, max_num_seqs=4, block_size=16, num_gpu_blocks_override=64)
PROMPTS, LENGTH = 4, 238
TEXTS = ["The quick brown fox", "Hello world", "def f(x):", "jumps over the lazy dog"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("tiny_llama")
    make_checkpoint(path)
    return str(path)


@pytest.mark.parametrize("settings,shape", [
    ((8, 8192, 2048, 257, 64), (8, 1024)),  # the step budget: 8192 / 8
    ((4, 8192, 256, 64, 16), (PROMPTS, LENGTH)),  # the pool: 63 // 4 = 15 blocks of 16, less 2 generated
    ((32, 8192, 256, 11, 16), (10, 14)),  # fewer usable blocks than sequences: one block each
    ((1, 8192, 100, 1000, 16), (1, 98)),  # max_model_len, less 2 generated
])
def test_shape_fills_the_budget_within_pool_and_length(settings, shape):
    assert warmup_shape(*settings) == shape


def test_runs_one_full_prefill_step_then_one_decode_step(tiny, monkeypatch):
    steps = []
    execute = InProcessExecutor.execute_model

    def spy(self, scheduler_output):
        steps.append(dict(scheduler_output.num_scheduled_tokens))
        return execute(self, scheduler_output)

    monkeypatch.setattr(InProcessExecutor, "execute_model", spy)
    llm = LLM(model=tiny, use_warmup=True, **KWARGS)
    assert [sorted(s.values()) for s in steps] == [[LENGTH] * PROMPTS, [1] * PROMPTS]
    assert_engine_idle(llm)


def test_leaves_no_trace(tiny):
    llm = LLM(model=tiny, use_warmup=1, **KWARGS)
    assert_engine_idle(llm)
    first = llm.generate({"prompt_token_ids": warmup_prompts(llm.get_tokenizer(), PROMPTS, LENGTH)[0]},
                         SamplingParams(temperature=0, max_tokens=1), use_tqdm=False)[0]
    assert first.request_id == "0"
    assert first.num_cached_tokens == 0  # the warm-up's KV is not in the prefix cache
    again = llm.generate({"prompt_token_ids": first.prompt_token_ids}, SamplingParams(temperature=0, max_tokens=1),
                         use_tqdm=False)[0]
    assert again.num_cached_tokens > 0  # while the prefix cache works


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
    SamplingParams(temperature=1.0, seed=11, max_tokens=16, ignore_eos=True),
    SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True),  # draws from the engine's generator
], ids=["greedy", "seeded", "unseeded"])
def test_same_tokens_as_without_warmup(tiny, params):
    outputs = []
    for use_warmup in (0, 1):
        llm = LLM(model=tiny, seed=7, use_warmup=use_warmup, **KWARGS)
        outputs.append([o.outputs.token_ids for o in llm.generate(TEXTS, params, use_tqdm=False)])
        del llm
    assert outputs[0] == outputs[1]
    assert all(len(ids) == 16 for ids in outputs[0])


def test_needs_an_idle_engine(tiny):
    llm = LLM(model=tiny, **KWARGS)
    engine = llm.llm_engine
    engine.add_request("Hello", None, SamplingParams(max_tokens=GENERATED))
    with pytest.raises(RuntimeError, match="warm_up needs an idle engine"):
        warm_up(engine)
