"""LLM(pipeline_parallel_size=P): the tokens of P = 1, steps in flight, and faults that never hang.

Oracle for the tokens: the single-process engine on the same checkpoint (itself tested against
transformers in tests/model_executor/), greedy tokens equal up to a near-tie of the P = 1 run
(helpers.assert_same_greedy), seeded sampling equal, logprobs close. Splits: P = 2 (even), P = 3 on
4 layers (1 / 2 / 1: uneven), P = 2 x T = 2, on a tiny dense Llama (tied and untied embeddings), the
tiny MoE models (Qwen3-MoE and ERNIE-4.5-MoE, 3 layers: 2 / 1) and the default model (P = 2, 3, 4
(uneven), 2 x 2). The batch queue: P steps in flight,
no request in two of them. Faults: a SIGKILLed stage, a stage raising mid-run, Ctrl-C, bad splits.
"""
import logging
import os
import signal
import time

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.executor.multiproc import WorkerFailure

from helpers import SMOLLM_BLOCK_SIZE, SMOLLM_MAX_MODEL_LEN
from test_tensor_parallel import (FAULT_DEADLINE_S, SMOLLM_PROMPTS, TINY_PROMPTS, alive, assert_close_logprobs,
                                  assert_same_tokens, child_pids, ctrl_c_after, failing_step, generate_in_thread,
                                  greedy_with_gaps)
from tiny_llama import make_tiny_llama
from tiny_moe import make_tiny_moe

SETTINGS = dict(max_model_len=512, num_gpu_blocks_override=64, seed=3)
SEEDED = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=11)  # draws independent of the batch
SCORED = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3, logprobs=3)


@pytest.fixture(scope="module")
def tiny_llama4(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama4")
    make_tiny_llama(path, layers=4)
    return str(path)


def reference(path: str, prompts=TINY_PROMPTS, **settings):
    """P = 1's greedy outputs (with gaps), seeded samples and scored outputs on `path`."""
    llm = LLM(model=path, **{**SETTINGS, **settings})
    try:
        return (greedy_with_gaps(llm, prompts, 24),
                [o.outputs[0].token_ids for o in llm.generate(prompts, SEEDED, use_tqdm=False)],
                llm.generate(prompts, SCORED, use_tqdm=False))
    finally:
        llm.shutdown()


def assert_same_as(llm, ref, what: str, prompts=TINY_PROMPTS) -> None:
    greedy, sampled, scored = ref
    assert_same_tokens(greedy_with_gaps(llm, prompts, 24), greedy, what)
    ours = [o.outputs[0].token_ids for o in llm.generate(prompts, SEEDED, use_tqdm=False)]
    assert ours == sampled, f"{what}: seeded sampling differs"
    for a, b in zip(llm.generate(prompts, SCORED, use_tqdm=False), scored):
        assert_close_logprobs(a.prompt_logprobs[1:], b.prompt_logprobs[1:])
        assert_close_logprobs(a.outputs[0].logprobs, b.outputs[0].logprobs)


# ---- the same tokens as one process ----------------------------------------------------------------
@pytest.mark.parametrize("tie", [False, True])
def test_dense_stages_give_the_tokens_of_one_process(tmp_path, tie, caplog):
    path = tmp_path / "llama"
    make_tiny_llama(path, tie=tie, layers=4)
    ref = reference(str(path))
    caplog.set_level(logging.INFO, logger="fastdeploy")
    for pp, tp in ((2, 1), (3, 1), (2, 2)):  # 2 / 2, 1 / 2 / 1 layers; two stages of two ranks
        llm = LLM(model=str(path), pipeline_parallel_size=pp, tensor_parallel_size=tp, **SETTINGS)
        if pp == 3:
            assert "pipeline stages (decoder layers): 0, 1-2, 3 (uneven" in caplog.text
        try:
            stats = llm.llm_engine.executor.worker_stats()
            assert [s.stage for s in stats] == [r // tp for r in range(pp * tp)]
            assert_same_as(llm, ref, f"tie={tie} P={pp} T={tp}")
            sent = [s.pipeline_bytes_sent > 0 for s in llm.llm_engine.executor.worker_stats()]
            assert sent == [r < (pp - 1) * tp and r % tp == 0 for r in range(pp * tp)]  # one copy per boundary
        finally:
            llm.shutdown()


@pytest.mark.parametrize("family", ["qwen3_moe", "ernie4_5_moe"])
def test_moe_stages_give_the_tokens_of_one_process(tmp_path, family):
    path = str(make_tiny_moe(tmp_path / family, family))  # 3 layers: the dense one and a sparse one on stage 0
    ref = reference(path)
    for pp, tp in ((2, 1), (3, 1), (2, 2)):
        llm = LLM(model=path, pipeline_parallel_size=pp, tensor_parallel_size=tp, **SETTINGS)
        try:
            assert_same_as(llm, ref, f"{family} P={pp} T={tp}")
        finally:
            llm.shutdown()


@pytest.mark.parametrize("pp,tp", [(2, 1), (3, 1), (4, 1), (2, 2)])
def test_default_model_stages_give_the_tokens_of_one_process(smollm_llm, smollm_path, pp, tp):
    """SmolLM2-135M's 30 layers as 15 / 15, 10 / 10 / 10, 7 / 8 / 8 / 7 (uneven) and two stages of two ranks."""
    ref = greedy_with_gaps(smollm_llm, SMOLLM_PROMPTS, 24)
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=16, ignore_eos=True)
    theirs = smollm_llm.generate(SMOLLM_PROMPTS, seeded, use_tqdm=False)
    llm = LLM(model=smollm_path, pipeline_parallel_size=pp, tensor_parallel_size=tp,
              max_model_len=SMOLLM_MAX_MODEL_LEN, block_size=SMOLLM_BLOCK_SIZE, max_num_seqs=16)
    try:
        assert_same_tokens(greedy_with_gaps(llm, SMOLLM_PROMPTS, 24), ref, f"SmolLM2 P={pp} T={tp}")
        ours = llm.generate(SMOLLM_PROMPTS, seeded, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in ours] == [o.outputs[0].token_ids for o in theirs]
    finally:
        llm.shutdown()


def test_each_stage_holds_its_share_of_the_parameters(tiny_llama4):
    """The stages' parameters add up to one process's, split by layer; the first holds the embedding,
    the last the final norm and lm_head."""
    from fastdeploy.worker.tp_worker import parameter_bytes

    single = LLM(model=tiny_llama4, **SETTINGS)
    model = single.llm_engine.executor.runner.model
    total = parameter_bytes(model)
    embed = model.model.embed_tokens.weight.numel().item() * 4
    head = model.lm_head.weight.numel().item() * 4 + model.model.norm.weight.numel().item() * 4
    layer = (total - embed - head) // 4
    single.shutdown()
    llm = LLM(model=tiny_llama4, pipeline_parallel_size=3, **SETTINGS)
    try:
        held = [s.parameter_bytes for s in llm.llm_engine.executor.worker_stats()]
    finally:
        llm.shutdown()
    assert held == [embed + layer, 2 * layer, layer + head], (held, embed, layer, head)


def test_tied_packed_embedding_stays_packed_on_the_first_stage(tmp_path):
    """A tied bf16 model: one process holds one packed copy that lm_head and the embedding share; with
    two stages each holds that copy (the first for its embedding), no float32 embedding."""
    from fastdeploy.worker.tp_worker import parameter_bytes

    make_tiny_llama(tmp_path, tie=True, layers=4)
    single = LLM(model=str(tmp_path), dtype="bfloat16", **SETTINGS)
    model = single.llm_engine.executor.runner.model
    total, copy = parameter_bytes(model), parameter_bytes(model.lm_head)
    single.shutdown()
    llm = LLM(model=str(tmp_path), dtype="bfloat16", pipeline_parallel_size=2, **SETTINGS)
    try:
        held = [s.parameter_bytes for s in llm.llm_engine.executor.worker_stats()]
    finally:
        llm.shutdown()
    assert sum(held) == total + copy, (held, total, copy)


# ---- the batch queue ---------------------------------------------------------------------------------
def test_batch_queue_keeps_p_steps_in_flight_without_a_request_in_two(tiny_llama4):
    """Many requests: the engine fills P = 2 steps before waiting for one, and no request is in two
    steps at once; preemption and chunked prefill under a small pool still give P = 1's tokens."""
    prompts = [{"prompt_token_ids": [3 + i, 40 + i] + list(range(100 + i, 100 + i + 30 + 7 * i))} for i in range(12)]
    settings = dict(num_gpu_blocks_override=12, block_size=16, max_model_len=160, enable_chunked_prefill=True,
                    max_num_batched_tokens=64, max_num_seqs=6)
    ref = reference(tiny_llama4, prompts, **settings)
    llm = LLM(model=tiny_llama4, pipeline_parallel_size=2, **{**SETTINGS, **settings})
    engine = llm.llm_engine
    depths, overlaps = [], []
    submit = engine.executor.submit

    def watching_submit(scheduler_output):
        in_flight = [set(so.num_scheduled_tokens) for so in engine._in_flight]
        overlaps.extend(set(scheduler_output.num_scheduled_tokens) & ids for ids in in_flight)
        depths.append(len(in_flight) + 1)
        submit(scheduler_output)

    engine.executor.submit = watching_submit
    preempt, preempted = engine.scheduler._preempt, []
    engine.scheduler._preempt = lambda request: (preempted.append(request.request_id), preempt(request))
    try:
        assert_same_as(llm, ref, "P=2, small pool, chunked prefill", prompts)
    finally:
        llm.shutdown()
    assert max(depths) == 2 and depths.count(2) > len(depths) // 3, depths
    assert not any(overlaps)
    assert preempted, "the small pool was meant to preempt"


# ---- bad splits ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,message", [
    (dict(pipeline_parallel_size=5), "pipeline_parallel_size=5 must be between 1 and the model's num_hidden_layers=4"),
    (dict(pipeline_parallel_size=0), "pipeline_parallel_size must be an int >= 1"),
    (dict(pipeline_parallel_size=2, speculative_config={"method": "ngram", "num_speculative_tokens": 2}),
     "speculative decoding under pipeline parallelism is not supported"),
    (dict(pipeline_parallel_size=2, tensor_parallel_size=3), "tensor_parallel_size=3 exceeds"),
    (dict(pipeline_parallel_size=3, nnodes=2, master_port=29999), "nnodes must divide the ranks"),
])
def test_bad_split_is_refused_before_any_worker_starts(tiny_llama4, kwargs, message):
    before = child_pids()
    with pytest.raises(ValueError, match=message):
        LLM(model=tiny_llama4, **kwargs)
    assert child_pids() <= before


def test_pooling_model_is_refused(tiny_llama4):
    with pytest.raises(ValueError, match="pipeline_parallel_size=2: pooling models run in one process"):
        LLM(model=tiny_llama4, runner="pooling", pipeline_parallel_size=2)


# ---- faults ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stage", [0, 1, 2])
def test_sigkilled_stage_fails_the_generate_in_time_and_leaves_no_process(tiny_llama4, stage):
    llm = LLM(model=tiny_llama4, pipeline_parallel_size=3, **SETTINGS)
    pids, outcome = llm.llm_engine.executor.pids, {}
    thread = generate_in_thread(llm, outcome)
    time.sleep(1.0)
    assert thread.is_alive(), "the generate finished before the stage could be killed mid-run"
    os.kill(pids[stage], signal.SIGKILL)
    killed = time.monotonic()
    thread.join(FAULT_DEADLINE_S)
    assert not thread.is_alive(), f"generate still running {FAULT_DEADLINE_S} s after stage {stage} was killed"
    error = outcome["error"]
    assert isinstance(error, WorkerFailure) and f"pipeline stage {stage}" in str(error) \
        and "SIGKILL" in str(error), error
    assert outcome["at"] - killed < FAULT_DEADLINE_S
    with pytest.raises(WorkerFailure, match=f"pipeline stage {stage}"):
        llm.generate(TINY_PROMPTS, SamplingParams(max_tokens=4), use_tqdm=False)
    assert not any(alive(pid) for pid in pids)
    llm.shutdown()


def test_exception_in_a_stage_is_an_error_naming_it_not_a_hang(tiny_llama4, tmp_path, monkeypatch):
    # the last stage raises in its fourth step (sitecustomize: imported by every new Python process)
    (tmp_path / "sitecustomize.py").write_text(failing_step(1, 4, "stage 1 step failure (injected by the test)"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    llm = LLM(model=tiny_llama4, pipeline_parallel_size=2, **SETTINGS)
    pids = llm.llm_engine.executor.pids
    start = time.monotonic()
    with pytest.raises(WorkerFailure) as e:
        llm.generate(TINY_PROMPTS, SamplingParams(max_tokens=50), use_tqdm=False)
    assert time.monotonic() - start < FAULT_DEADLINE_S
    assert "worker rank 1 (pipeline stage 1, tensor-parallel rank 0) failed in the step" in str(e.value)
    assert "stage 1 step failure" in str(e.value)
    assert not any(alive(pid) for pid in pids)
    llm.shutdown()


def test_ctrl_c_mid_generate_leaves_a_usable_llm(tiny_llama4):
    llm = LLM(model=tiny_llama4, pipeline_parallel_size=2, **SETTINGS)
    try:
        ref = greedy_with_gaps(llm, TINY_PROMPTS, 16)
        ctrl_c_after(llm, "submit", 6)  # two steps in flight
        assert any(llm.llm_engine.executor._owed)  # their answers still pending
        assert not llm.llm_engine.scheduler.in_flight and not llm.llm_engine._in_flight
        assert_same_tokens(greedy_with_gaps(llm, TINY_PROMPTS, 16), ref, "after Ctrl-C")
        assert not any(llm.llm_engine.executor._owed)
    finally:
        llm.shutdown()
