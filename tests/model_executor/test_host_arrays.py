"""as_paddle: zero-copy numpy -> paddle.Tensor without the list Paddle 3.3's Tensor constructor leaks.

The leak is counted as gc-tracked lists that outlive the calls: the constructor's path leaves one per
call (checked here too, so the day Paddle fixes it this file says so), as_paddle none, and a whole
engine step (greedy, sampled with penalties and logprobs) none either.
"""
import gc
import weakref

import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.host_arrays import as_paddle
from helpers import run


def lists_left_by(fn, calls=50) -> int:
    fn()
    gc.collect()
    before = sum(type(o) is list for o in gc.get_objects())
    for _ in range(calls):
        fn()
    gc.collect()
    return sum(type(o) is list for o in gc.get_objects()) - before


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.float64, np.uint8])
def test_as_paddle_shares_memory_shape_and_dtype(dtype):
    array = np.arange(12).astype(dtype).reshape(3, 4)
    tensor = as_paddle(array)
    assert tuple(tensor.shape) == (3, 4) and tensor.dtype == paddle.to_tensor(array[:1]).dtype
    np.testing.assert_array_equal(tensor.numpy(), array)
    array[1, 2] = 99
    assert np.from_dlpack(tensor)[1, 2] == 99  # same buffer


def test_as_paddle_copies_a_non_contiguous_array_and_keeps_the_source_alive():
    array = np.arange(20, dtype=np.float32).reshape(4, 5)
    np.testing.assert_array_equal(as_paddle(array[:, ::2]).numpy(), array[:, ::2])

    owned = np.ones(8, np.float32)
    ref = weakref.ref(owned)
    tensor = as_paddle(owned)
    del owned
    gc.collect()
    assert ref() is not None and float(tensor.sum()) == 8.0
    del tensor
    gc.collect()
    assert ref() is None


def test_paddle_constructor_leaks_and_as_paddle_does_not():
    array = np.ones((4, 4), np.float32)
    assert lists_left_by(lambda: paddle.to_tensor(array)) >= 50  # Paddle 3.3: one list per call
    assert lists_left_by(lambda: as_paddle(array)) == 0


def test_engine_steps_leave_no_list_behind(smollm_path):
    from fastdeploy import LLM, SamplingParams

    llm = LLM(model=smollm_path, max_model_len=256)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    sampled = SamplingParams(temperature=0.9, top_p=0.9, top_k=20, repetition_penalty=1.2, presence_penalty=0.3,
                             max_tokens=24, ignore_eos=True, logprobs=3, seed=1)
    for params in (greedy, sampled):
        left = lists_left_by(lambda: run(llm, ["Hello", "The sky is"], params), calls=3)
        assert left == 0, f"{left} lists left behind by {3 * 24} steps with {params}"
    llm.shutdown()
