"""The n-gram proposer against a brute-force search, and the acceptance rule on worked examples."""
import numpy as np
import pytest

from fastdeploy.spec_decode.ngram import propose_ngram
from fastdeploy.spec_decode.verify import accepted_tokens


def brute_force(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The longest n in [min_n, max_n] whose last-n tokens occur earlier; the earliest occurrence's
    next k tokens."""
    for n in range(max_n, min_n - 1, -1):
        if n >= len(tokens):
            continue
        suffix = tokens[-n:]
        for start in range(len(tokens) - n):  # occurrences other than the suffix itself
            if tokens[start : start + n] == suffix:
                return tokens[start + n : start + n + k]
    return []


def test_documented_example():
    # the last 3-gram [4, 2, 3] has no earlier occurrence; the 2-gram [2, 3] occurs at 1
    assert propose_ngram(np.array([1, 2, 3, 4, 2, 3]), 2, 3, 4) == [4, 2, 3]
    assert propose_ngram(np.array([1, 2, 3, 4, 2, 3]), 3, 3, 4) == []
    assert propose_ngram(np.array([7]), 1, 3, 4) == []


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force_on_random_sequences(seed):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 4 if seed % 2 else 12, size=int(rng.integers(2, 60))).tolist()
    min_n = int(rng.integers(1, 4))
    max_n = min_n + int(rng.integers(0, 4))
    k = int(rng.integers(1, 8))
    assert propose_ngram(np.array(tokens, dtype=np.int64), min_n, max_n, k) == brute_force(tokens, min_n, max_n, k)


def test_acceptance_rule():
    assert accepted_tokens([1, 2, 3, 11], [1, 2, 3]) == [1, 2, 3, 11]  # all drafts match: the bonus token too
    assert accepted_tokens([4, 55, 12], [4, 5]) == [4, 55]  # the first mismatch is kept, the rest dropped
    assert accepted_tokens([9, 6, 7], [5, 6]) == [9]  # a later match after a mismatch counts for nothing
    assert accepted_tokens([8], []) == [8]
