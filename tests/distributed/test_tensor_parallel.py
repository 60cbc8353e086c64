"""LLM(tensor_parallel_size=N): the same tokens as N = 1, and faults that never hang.

Oracle for the tokens: the single-process engine on the same checkpoint (itself tested against
transformers in tests/model_executor/), greedy tokens equal up to a near-tie of the N = 1 run
(helpers.assert_same_greedy: the all-reduce sums partial products in another order, so logits differ
by float rounding), seeded sampling equal. The packed weight formats (bf16, wint8, wint4) against
the single process in the same format (which runs the fused decoder-layer op, the ranks layer
by layer), the ranks holding the same bytes of parameters in all. Faults: a SIGKILLed worker, a
rank failing to load or raising mid-run, a port in use; after each, and after construct/destroy
cycles, no worker process is left (and the engine process does not grow from cycle to cycle).
"""
import os
import signal
import threading
import time

import pytest

from fastdeploy import LLM, SamplingParams
from fastdeploy.executor.multiproc import WorkerFailure

from fastdeploy.worker.tp_worker import parameter_bytes
from helpers import SMOLLM_BLOCK_SIZE, SMOLLM_MAX_MODEL_LEN, assert_same_greedy, top2_gaps
from tiny_llama import make_tiny_llama
from tiny_moe import make_tiny_moe

SMOLLM_PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):"]
TINY_PROMPTS = [{"prompt_token_ids": ids} for ids in ([5, 6, 7, 8, 9], list(range(10, 75)), [300] * 3)]
FAULT_DEADLINE_S = 10  # a dead worker must surface as an error within this


def greedy_with_gaps(llm, prompts, max_tokens):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=2)
    return [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]


def assert_same_tokens(ours, ref, what):
    for i, (a, b) in enumerate(zip(ours, ref)):
        assert_same_greedy(a.token_ids, b.token_ids, top2_gaps(b), f"{what} prompt {i}")


def alive(pid: int) -> bool:
    """True while a process with this pid exists (and is not a reaped zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def child_pids() -> set[int]:
    pids = set()
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children", encoding="utf-8") as f:
            pids |= {int(p) for p in f.read().split()}
    return pids


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_llama")
    make_tiny_llama(path)
    return str(path)


# ---- the same tokens as one process ----------------------------------------------------------------
@pytest.mark.parametrize("size", [2, 3])
def test_smollm_gguf_greedy_equals_one_process(smollm_llm, smollm_path, size):
    ref = greedy_with_gaps(smollm_llm, SMOLLM_PROMPTS, 24)
    llm = LLM(model=smollm_path, tensor_parallel_size=size, max_model_len=SMOLLM_MAX_MODEL_LEN,
              block_size=SMOLLM_BLOCK_SIZE, max_num_seqs=16)
    try:
        assert_same_tokens(greedy_with_gaps(llm, SMOLLM_PROMPTS, 24), ref, f"SmolLM2 TP={size}")
        seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_tokens=16, ignore_eos=True)
        ours = llm.generate(SMOLLM_PROMPTS, seeded, use_tqdm=False)
        theirs = smollm_llm.generate(SMOLLM_PROMPTS, seeded, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in ours] == [o.outputs[0].token_ids for o in theirs]
    finally:
        llm.shutdown()


@pytest.mark.parametrize("family", ["qwen3_moe", "ernie4_5_moe"])
def test_tiny_moe_greedy_equals_one_process(tmp_path, family):
    path = str(make_tiny_moe(tmp_path / family, family))
    settings = dict(max_model_len=512, num_gpu_blocks_override=64, seed=3)
    single = LLM(model=path, **settings)
    ref = greedy_with_gaps(single, TINY_PROMPTS, 32)
    seeded = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True)  # unseeded: the engine's seed
    ref_sampled = [o.outputs[0].token_ids for o in single.generate(TINY_PROMPTS, seeded, use_tqdm=False)]
    scored = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3, logprobs=3)
    ref_scored = single.generate(TINY_PROMPTS, scored, use_tqdm=False)
    single.shutdown()
    for size in (2, 3):
        llm = LLM(model=path, tensor_parallel_size=size, **settings)
        try:
            assert_same_tokens(greedy_with_gaps(llm, TINY_PROMPTS, 32), ref, f"{family} TP={size}")
            sampled = [o.outputs[0].token_ids for o in llm.generate(TINY_PROMPTS, seeded, use_tqdm=False)]
            assert sampled == ref_sampled, f"{family} TP={size}: sampling from the engine's seed differs"
            for ours, theirs in zip(llm.generate(TINY_PROMPTS, scored, use_tqdm=False), ref_scored):
                assert_close_logprobs(ours.prompt_logprobs[1:], theirs.prompt_logprobs[1:])
                assert_close_logprobs(ours.outputs[0].logprobs, theirs.outputs[0].logprobs)
        finally:
            llm.shutdown()


def assert_close_logprobs(ours: list[dict], theirs: list[dict]) -> None:
    """The same scored ids at each position (up to near-ties) with logprobs within 1e-4."""
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        for token, lp in b.items():
            if token in a:
                assert abs(a[token].logprob - lp.logprob) < 1e-4, (token, a[token], lp)
            else:  # only a candidate tied with another may be swapped out of the top k
                assert min(abs(lp.logprob - x.logprob) for t, x in b.items() if t != token) < 1e-3


# ---- the packed weight formats: each rank packs its own shard -----------------------------------------
# Packed matmuls round their input rows to bf16, so a float32 sum-order difference that flips one rounding
# grows to bf16 noise downstream (and may flip an MoE routing near-tie at a token): N = 2 and N = 1 then
# differ by bf16 steps, not float32 ones.
PACKED_NEAR_TIE = 0.1  # top-2 logprob gap below which bf16 noise may pick either token
PACKED_LOGPROB_TOL = 0.05  # |logprob difference| of at least 95% of the scored candidates
PACKED_FORMATS = {"bfloat16": dict(dtype="bfloat16"), "wint8": dict(quantization="wint8"),
                  "wint4": dict(quantization="wint4")}
WINT4_SPLITTABLE = dict(intermediate_size=128, moe_intermediate_size=64)  # halves: multiples of 32 inputs


@pytest.mark.parametrize("fmt,family", [("bfloat16", "ernie4_5_moe"), ("wint8", "qwen3_moe"),
                                        ("wint4", "ernie4_5_moe")])
def test_packed_format_is_kept_by_the_ranks_with_the_same_tokens(tmp_path, tiny_llama, fmt, family):
    moe = str(make_tiny_moe(tmp_path / family, family, **WINT4_SPLITTABLE))  # ERNIE: tied packed lm_head
    settings = dict(max_model_len=512, num_gpu_blocks_override=64, **PACKED_FORMATS[fmt])
    scored = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=3, logprobs=3)
    for path in (tiny_llama, moe):
        single = LLM(model=path, **settings)
        ref = greedy_with_gaps(single, TINY_PROMPTS, 24)
        ref_scored = single.generate(TINY_PROMPTS, scored, use_tqdm=False)
        ref_bytes = parameter_bytes(single.llm_engine.executor.runner.model)
        single.shutdown()
        llm = LLM(model=path, tensor_parallel_size=2, **settings)
        try:
            held = sum(s.parameter_bytes for s in llm.llm_engine.executor.worker_stats())
            assert 0.98 < held / ref_bytes < 1.05, f"{fmt} {path}: the ranks hold {held} bytes, one process {ref_bytes}"
            for i, (ours, theirs) in enumerate(zip(greedy_with_gaps(llm, TINY_PROMPTS, 24), ref)):
                first = next((j for j, (a, b) in enumerate(zip(ours.token_ids, theirs.token_ids)) if a != b), None)
                assert first is None or top2_gaps(theirs)[first] < PACKED_NEAR_TIE, (fmt, path, i, first)
            differences = [abs(a[t].logprob - lp.logprob)
                           for ours, theirs in zip(llm.generate(TINY_PROMPTS, scored, use_tqdm=False), ref_scored)
                           for a, b in zip(ours.prompt_logprobs[1:] + ours.outputs[0].logprobs,
                                           theirs.prompt_logprobs[1:] + theirs.outputs[0].logprobs)
                           for t, lp in b.items() if t in a]
            assert sorted(differences)[int(0.95 * len(differences))] < PACKED_LOGPROB_TOL, (fmt, path)
            assert max(differences) < 1.0, (fmt, path, max(differences))  # an MoE routing flip at most
        finally:
            llm.shutdown()


def test_wint4_split_inside_its_groups_is_refused_before_any_worker_starts(tmp_path):
    path = str(make_tiny_moe(tmp_path / "moe", "qwen3_moe"))  # intermediate 96: 48 inputs per rank
    before = child_pids()
    with pytest.raises(ValueError, match=r"rank 0 would hold 48 input features of model.layers.\*.mlp.down_proj "
                                         r"\(intermediate_size=96 / 2\), not a multiple of 32"):
        LLM(model=path, tensor_parallel_size=2, quantization="wint4", max_model_len=512)
    assert child_pids() <= before, (child_pids(), before)


def test_unsplittable_model_is_refused_before_any_worker_starts(tiny_llama):
    before = child_pids()
    with pytest.raises(ValueError, match="tensor_parallel_size=3 exceeds the model's num_key_value_heads=2"):
        LLM(model=tiny_llama, tensor_parallel_size=3)
    assert child_pids() <= before, (child_pids(), before)  # no new process left


# ---- faults ------------------------------------------------------------------------------------------
def generate_in_thread(llm, outcome: dict) -> threading.Thread:
    """A long generate running on a thread; `outcome` gets its "error" (None when it finished) and
    the time it raised ("at")."""
    def long_generate():
        try:
            llm.generate(TINY_PROMPTS * 4, SamplingParams(max_tokens=400, ignore_eos=True), use_tqdm=False)
            outcome["error"] = None
        except Exception as e:  # noqa: BLE001 (the error is the result)
            outcome["error"], outcome["at"] = e, time.monotonic()

    thread = threading.Thread(target=long_generate)
    thread.start()
    return thread


def test_sigkilled_worker_fails_this_and_the_next_generate_and_leaves_no_process(tiny_llama):
    llm = LLM(model=tiny_llama, tensor_parallel_size=2, max_model_len=512, num_gpu_blocks_override=64)
    pids, outcome = llm.llm_engine.executor.pids, {}
    thread = generate_in_thread(llm, outcome)
    time.sleep(1.0)
    assert thread.is_alive(), "the generate finished before the worker could be killed mid-run"
    os.kill(pids[1], signal.SIGKILL)
    killed = time.monotonic()
    thread.join(FAULT_DEADLINE_S)
    assert not thread.is_alive(), f"generate still running {FAULT_DEADLINE_S} s after a worker was killed"
    error = outcome["error"]
    assert isinstance(error, WorkerFailure) and "rank 1" in str(error) and "SIGKILL" in str(error), error
    assert outcome["at"] - killed < FAULT_DEADLINE_S
    start = time.monotonic()
    with pytest.raises(WorkerFailure, match="rank 1"):
        llm.generate(TINY_PROMPTS, SamplingParams(max_tokens=4), use_tqdm=False)
    assert time.monotonic() - start < 1.0
    assert not any(alive(pid) for pid in pids)
    llm.shutdown()


def ctrl_c_after(llm, method: str, calls: int) -> None:
    """Run a long generate that Ctrl-C interrupts right after the executor's `method` was called
    `calls` times (the step sent to the workers, not yet answered); KeyboardInterrupt expected."""
    executor = llm.llm_engine.executor
    original, made = getattr(executor, method), []

    def then_ctrl_c(*args):
        original(*args)
        made.append(args)
        if len(made) == calls:
            os.kill(os.getpid(), signal.SIGINT)

    setattr(executor, method, then_ctrl_c)
    # a test run started in the background by a shell ignores SIGINT: Ctrl-C's handler set here
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate(TINY_PROMPTS * 4, SamplingParams(max_tokens=400, ignore_eos=True), use_tqdm=False)
    finally:
        signal.signal(signal.SIGINT, previous)
        delattr(executor, method)
    assert len(made) == calls


def test_ctrl_c_mid_generate_leaves_a_usable_llm(tiny_llama):
    llm = LLM(model=tiny_llama, tensor_parallel_size=2, max_model_len=512, num_gpu_blocks_override=64)
    try:
        ref = greedy_with_gaps(llm, TINY_PROMPTS, 16)
        ctrl_c_after(llm, "_send", 5)
        assert any(llm.llm_engine.executor._owed)  # interrupted mid-step: its answers still pending
        # the interrupted step's answers are drained first; the next call gets its own tokens
        assert_same_tokens(greedy_with_gaps(llm, TINY_PROMPTS, 16), ref, "after Ctrl-C")
    finally:
        llm.shutdown()


SITECUSTOMIZE = '''
import os
if os.environ.get("PADDLE_TRAINER_ID") == "1":  # only rank 1 fails while loading its shard
    from fastdeploy.distributed import sharding

    def fail(self, weights):
        raise MemoryError("rank 1 could not allocate its shard (injected by the test)")

    sharding.TensorParallelShard.shard_weights = fail
'''


def test_rank_failing_at_load_surfaces_its_message(tiny_llama, tmp_path, monkeypatch):
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)  # imported by every new Python process
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    before = child_pids()
    with pytest.raises(WorkerFailure) as e:
        LLM(model=tiny_llama, tensor_parallel_size=2, max_model_len=512, num_gpu_blocks_override=64)
    message = str(e.value)
    assert "rank 1 failed in the start-up" in message and "MemoryError: rank 1 could not allocate" in message, message
    assert child_pids() <= before, (child_pids(), before)  # no new process left


def failing_step(rank: int, step: int, message: str) -> str:
    """A sitecustomize.py making worker `rank` raise RuntimeError(message) in its `step`-th step."""
    return f'''
import os
if os.environ.get("PADDLE_TRAINER_ID") == "{rank}":
    from fastdeploy.worker import model_runner

    calls = [0]
    original = model_runner.ModelRunner.execute_model

    def execute_model(self, out):
        calls[0] += 1
        if calls[0] == {step}:
            raise RuntimeError("{message}")
        return original(self, out)

    model_runner.ModelRunner.execute_model = execute_model
'''


def test_exception_on_one_rank_mid_run_is_an_error_not_a_hang(tiny_llama, tmp_path, monkeypatch):
    # rank 1 raises in its third step, before any collective
    (tmp_path / "sitecustomize.py").write_text(failing_step(1, 3, "rank 1 step failure (injected by the test)"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    llm = LLM(model=tiny_llama, tensor_parallel_size=2, max_model_len=512, num_gpu_blocks_override=64)
    pids = llm.llm_engine.executor.pids
    start = time.monotonic()
    with pytest.raises(WorkerFailure) as e:  # rank 0 waits in an all-reduce rank 1 never joins
        llm.generate(TINY_PROMPTS, SamplingParams(max_tokens=50), use_tqdm=False)
    assert time.monotonic() - start < FAULT_DEADLINE_S
    assert "rank 1 failed in the step" in str(e.value) and "rank 1 step failure" in str(e.value)
    with pytest.raises(WorkerFailure, match="rank 1"):
        llm.generate(TINY_PROMPTS, SamplingParams(max_tokens=4), use_tqdm=False)
    assert not any(alive(pid) for pid in pids)
    llm.shutdown()


def test_master_port_in_use_is_refused(tiny_llama):
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        before = child_pids()
        with pytest.raises(ValueError, match=f"master_port={port} on 127.0.0.1 is in use"):
            LLM(model=tiny_llama, tensor_parallel_size=2, master_port=port, max_model_len=512)
        assert child_pids() <= before, (child_pids(), before)  # no new process left


def test_automatic_port_taken_before_rank_0_binds_it_is_retried(tiny_llama, monkeypatch):
    import socket

    from fastdeploy.executor import multiproc

    with socket.socket() as busy:  # the port the first attempt gets is taken (as by another job meanwhile)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        handed_out, really_free = [], multiproc.free_port

        def first_busy_then_free(host):
            handed_out.append(busy.getsockname()[1] if not handed_out else really_free(host))
            return handed_out[-1]

        monkeypatch.setattr(multiproc, "free_port", first_busy_then_free)
        llm = LLM(model=tiny_llama, tensor_parallel_size=2, max_model_len=512, num_gpu_blocks_override=64)
        try:
            assert len(handed_out) == 2 and handed_out[0] == busy.getsockname()[1]
            assert len(llm.generate(TINY_PROMPTS, SamplingParams(max_tokens=4), use_tqdm=False)) == len(TINY_PROMPTS)
        finally:
            llm.shutdown()


@pytest.mark.parametrize("gloo_error", ["[gloo/transport/tcp/pair.cc:784] connect [127.0.0.1]:32666: Connection refused",
                                        "[gloo/transport/tcp/pair.cc:914] TIMEOUT self_rank = 0 pair_rank = 1 "
                                        "peer_str = [127.0.0.1]:32657"])
def test_refused_rendezvous_is_retried_on_a_new_port(tiny_llama, monkeypatch, gloo_error):
    """A start-up whose ranks could not connect (gloo: "Connection refused", or a pair's connection
    timing out while a group is created) is retried from scratch on another automatic port."""
    from fastdeploy.executor import multiproc

    attempts, real_start = [], multiproc.MultiprocExecutor._start

    def refused_once(self, fd_config, port, timeout):
        attempts.append(port)
        if len(attempts) == 1:
            raise WorkerFailure(f"rank 1 failed at start-up: RuntimeError: {gloo_error}")
        return real_start(self, fd_config, port, timeout)

    monkeypatch.setattr(multiproc.MultiprocExecutor, "_start", refused_once)
    llm = LLM(model=tiny_llama, tensor_parallel_size=2, max_model_len=512, num_gpu_blocks_override=64)
    try:
        assert len(attempts) == 2
        assert len(llm.generate(TINY_PROMPTS, SamplingParams(max_tokens=4), use_tqdm=False)) == len(TINY_PROMPTS)
    finally:
        llm.shutdown()


def resident_mib() -> float:
    with open("/proc/self/statm", encoding="utf-8") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_construct_destroy_five_times_leaves_no_process(tiny_llama):
    before = child_pids()
    rss = []
    for i in range(5):
        llm = LLM(model=tiny_llama, tensor_parallel_size=2, max_model_len=512, num_gpu_blocks_override=64)
        pids = llm.llm_engine.executor.pids
        assert len(llm.generate(TINY_PROMPTS, SamplingParams(max_tokens=4), use_tqdm=False)) == len(TINY_PROMPTS)
        if i % 2:
            llm.shutdown()
        else:
            del llm  # no shutdown(): the executor's __del__ releases the workers
        assert not any(alive(pid) for pid in pids), f"cycle {i}: a worker outlived its LLM"
        assert child_pids() <= before, (child_pids(), before)  # no new process left
        rss.append(resident_mib())
    assert rss[-1] - rss[0] < 32, f"the engine process grew by {rss[-1] - rss[0]:.0f} MiB over 4 cycles: {rss}"
