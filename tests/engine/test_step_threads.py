"""A step on a thread other than the one that built the engine computes on the engine's threads.

OpenMP keeps its thread count per calling thread, so a new thread (the API server's engine loop, an
application calling LLM.generate from a worker thread) would compute on one core: the engine sets
the count on each thread's first step. (benchmarks/README.md has what that costs when missing.)
"""
import threading

from fastdeploy import SamplingParams
from fastdeploy.engine import engine as engine_module


def test_each_thread_gets_the_compute_threads_on_its_first_step(smollm_llm, monkeypatch):
    calls = []
    real = engine_module.set_paddle_threads
    monkeypatch.setattr(engine_module, "set_paddle_threads",
                        lambda: calls.append(threading.get_ident()) or real())

    def two_calls():
        smollm_llm.generate("Hello", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
        smollm_llm.generate("Hi", SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)

    idents = []
    for _ in range(2):
        worker = threading.Thread(target=lambda: (idents.append(threading.get_ident()), two_calls()))
        worker.start()
        worker.join()
    assert calls == idents  # once per new thread, however many steps it runs
