"""The compiled penalties op (custom_ops/cpu_ops/penalties.cc) against its numpy reference
(layers/sample/penalties.py).

Penalties: rtol 1e-6 (the op may multiply by 1 / repetition where numpy divides), atol 1e-6 (where
the subtraction of frequency and presence penalties cancels).
"""
import fastdeploy  # noqa: F401  (before paddle)
import numpy as np
import pytest

from fastdeploy.model_executor.layers.sample.penalties import PenaltyInputs, apply_penalties
from fastdeploy.model_executor.ops.sampling import apply_penalties_

from sampling_reference import compiled  # noqa: F401  (autouse fixture: every test here runs the compiled ops)
from sampling_reference import random_penalties


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compiled_penalties_match_the_reference(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 5, (16, 49152)).astype(np.float32)
    logits[0, :10] = -np.inf  # banned earlier: stays -inf
    penalties = random_penalties(rng, 16, 49152)
    penalties.token_ids[:10][penalties.rows[:10] == 0] = np.arange(10)[penalties.rows[:10] == 0]
    expected = logits.copy()
    apply_penalties(expected, penalties)

    apply_penalties_(logits, penalties)

    np.testing.assert_allclose(logits, expected, rtol=1e-6, atol=1e-6)
    touched = np.zeros(logits.shape, bool)
    touched[penalties.rows, penalties.token_ids] = True
    assert (logits[~touched] == expected[~touched]).all()


def test_penalty_entries_outside_the_logits_raise():
    logits = np.zeros((2, 10), np.float32)
    bad = PenaltyInputs(np.array([1]), np.array([10]), np.ones(1, np.float32), np.ones(2, np.float32),
                        np.zeros(2, np.float32), np.ones(2, np.float32))
    with pytest.raises(Exception, match="outside logits"):
        apply_penalties_(logits, bad)

