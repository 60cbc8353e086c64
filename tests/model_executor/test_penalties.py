"""Penalties, bans, bad words and logprobs of the sampling layer against dense numpy references.

The references are written here from the documented semantics (FastDeploy's
`get_token_penalty_multi_scores`, SamplingParams' docstring, vLLM's bad-words rule and logprob
ranks), densely over the whole vocabulary, independent of the sparse implementation:

  1. repetition penalty r over tokens in prompt or output: l > 0 -> l / r, else l * r;
  2. l -= frequency * count_in_output + presence * [count_in_output > 0];
  3. EOS / stop ids -> -inf while fewer than min_tokens are generated; bad words -> -inf;
  4. division by temperature (greedy rows: none).
"""
from collections import Counter
from types import SimpleNamespace

import fastdeploy  # noqa: F401  (before paddle)
import numpy as np
import paddle
import pytest

from fastdeploy.model_executor.layers.sample import bad_words, logprobs, penalties
from fastdeploy.model_executor.layers.sample.sampler import SamplingMetadata, sample
from fastdeploy.worker.sampling_inputs import penalty_inputs

ROWS, VOCAB = 8, 500
EOS = VOCAB - 1


# ---- random batches -------------------------------------------------------------------------------
def make_requests(seed: int, all_neutral: bool = False):
    """ROWS fake requests with random prompts/outputs (repeats, prompt/output overlap, an empty
    output), random penalties (some neutral rows, some repetition < 1), min_tokens, stop ids and
    bad-word sequences (some matching the end of the output, some not)."""
    rng = np.random.default_rng(seed)
    requests = []
    for row in range(ROWS):
        pool = rng.choice(VOCAB - 1, size=int(rng.integers(5, 40)), replace=False)  # repeats likely
        prompt = [int(t) for t in rng.choice(pool, size=int(rng.integers(1, 30)))]
        n_out = 0 if row == 0 else int(rng.integers(0, 25))
        output = [int(t) for t in rng.choice(pool, size=n_out)]
        if row == 1 and output:
            output[-1] = prompt[0]  # a token certainly in both prompt and output
        kind = "neutral" if all_neutral else ["neutral", "rep<1", "rep>1", "freq", "pres", "all", "all"][row % 7]
        rep, freq, pres = 1.0, 0.0, 0.0
        if kind == "rep<1":
            rep = float(rng.uniform(0.3, 0.95))
        elif kind == "rep>1":
            rep = float(rng.uniform(1.05, 2.5))
        elif kind == "freq":
            freq = float(rng.uniform(-2, 2))
        elif kind == "pres":
            pres = float(rng.uniform(-2, 2))
        elif kind == "all":
            rep, freq, pres = float(rng.uniform(0.5, 2)), float(rng.uniform(-2, 2)), float(rng.uniform(-2, 2))
        # bad words: one-token words, a word whose prefix is the end of the output, one that is not
        seqs = {(int(rng.integers(VOCAB)),)}
        if output:
            seqs.add(tuple(output[-2:]) + (int(rng.integers(VOCAB)),))  # matches: last token banned
        seqs.add((int(rng.integers(VOCAB)), int(rng.integers(VOCAB)), int(rng.integers(VOCAB))))
        params = SimpleNamespace(
            repetition_penalty=rep, frequency_penalty=freq, presence_penalty=pres,
            min_tokens=int(rng.integers(0, 6)),
            stop_token_ids=[int(t) for t in rng.choice(VOCAB, size=int(rng.integers(0, 3)))],
            temperature=0.0 if row % 3 == 0 else float(rng.uniform(0.3, 2.0)),
        )
        requests.append(SimpleNamespace(sampling_params=params, prompt_token_ids=prompt, output_token_ids=output,
                                        prompt_unique=None, bad_words_token_ids=sorted(seqs),
                                        eos_token_ids=frozenset({EOS})))
    logits = rng.normal(0, 3, size=(ROWS, VOCAB)).astype(np.float32)
    logits[:, ::37] = 0.0  # exact zeros: l <= 0 takes the l * r branch
    for row, request in enumerate(requests):  # seen tokens with both signs
        for t in request.prompt_token_ids[:3]:
            logits[row, t] = abs(logits[row, t]) + 0.1
        for t in request.output_token_ids[:3]:
            logits[row, t] = -abs(logits[row, t]) - 0.1
    return requests, logits


def reference_processed(logits: np.ndarray, requests) -> np.ndarray:
    """Dense float32 reference of penalties + bans (before temperature), one row at a time."""
    out = logits.astype(np.float32).copy()
    for row, request in enumerate(requests):
        sp = request.sampling_params
        rep, freq, pres = np.float32(sp.repetition_penalty), np.float32(sp.frequency_penalty), np.float32(sp.presence_penalty)
        n_out = np.bincount(np.asarray(request.output_token_ids, np.int64), minlength=VOCAB).astype(np.float32)
        n_prompt = np.bincount(np.asarray(request.prompt_token_ids, np.int64), minlength=VOCAB)
        seen = (n_out > 0) | (n_prompt > 0)
        l = out[row]
        l = np.where(seen, np.where(l > 0, l / rep, l * rep), l)
        l = l - (freq * n_out + pres * (n_out > 0).astype(np.float32))
        banned = np.zeros(VOCAB, bool)
        if len(request.output_token_ids) < sp.min_tokens:
            banned[sorted(request.eos_token_ids | set(sp.stop_token_ids))] = True
        output = list(request.output_token_ids)
        for seq in request.bad_words_token_ids:
            *prefix, last = seq
            if not prefix or (len(output) >= len(prefix) and output[len(output) - len(prefix):] == prefix):
                banned[last] = True
        l[banned] = -np.inf
        out[row] = l
    return out


def banned_pairs(requests) -> list:
    """(row, ids) pairs as the model runner builds them (bad words now + EOS/stop under min_tokens)."""
    pairs = []
    for row, request in enumerate(requests):
        sp = request.sampling_params
        ids = list(bad_words.banned_now(request.bad_words_token_ids, request.output_token_ids))
        if len(request.output_token_ids) < sp.min_tokens:
            ids += sorted(request.eos_token_ids | set(sp.stop_token_ids))
        if ids:
            pairs.append((row, ids))
    return pairs


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    top = x.max(axis=-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))


SEEDS = [0, 1, 2, 3, 4, 5]


# ---- seen_tokens / penalties / bans -----------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
def test_seen_tokens_lists_each_token_once_with_its_output_count(seed):
    for request in make_requests(seed)[0]:
        ids, counts = penalties.seen_tokens(np.unique(request.prompt_token_ids), request.output_token_ids)
        expected = Counter(request.output_token_ids)
        for t in request.prompt_token_ids:
            expected.setdefault(t, 0)
        assert len(ids) == len(set(ids.tolist())) == len(expected)
        assert dict(zip(ids.tolist(), counts.tolist())) == {t: float(c) for t, c in expected.items()}
        assert counts.dtype == np.float32


@pytest.mark.parametrize("seed", SEEDS)
def test_penalties_and_bans_match_dense_reference(seed):
    requests, logits = make_requests(seed)
    expected = reference_processed(logits, requests)
    x = logits.copy()
    inputs = penalty_inputs(requests)
    assert inputs is not None
    penalties.apply_penalties(x, inputs)
    penalties.apply_bans(x, banned_pairs(requests))
    np.testing.assert_allclose(x, expected, rtol=1e-6)
    assert np.isinf(expected).any() and not np.array_equal(np.isinf(expected), np.isinf(logits))


def test_all_neutral_rows_need_no_penalty_inputs():
    requests, logits = make_requests(11, all_neutral=True)
    assert penalty_inputs(requests) is None
    x = logits.copy()
    penalties.apply_bans(x, banned_pairs(requests))
    np.testing.assert_allclose(x, reference_processed(logits, requests), rtol=1e-6)


def test_penalty_formula_on_hand_computed_values():
    """One row, worked by hand: prompt [1, 2], output [2, 3, 3], r = 2, frequency 0.5, presence 0.25."""
    logits = np.array([[1.0, 4.0, -4.0, 6.0, 3.0]], np.float32)
    request = SimpleNamespace(
        sampling_params=SimpleNamespace(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25),
        prompt_token_ids=[1, 2], output_token_ids=[2, 3, 3], prompt_unique=None)
    penalties.apply_penalties(logits, penalty_inputs([request]))
    # token 1 (prompt only): 4 / 2; token 2 (prompt + output once): -4 * 2 - 0.5 - 0.25;
    # token 3 (output twice): 6 / 2 - 1.0 - 0.25; tokens 0 and 4 untouched
    np.testing.assert_allclose(logits[0], [1.0, 2.0, -8.75, 1.75, 3.0], rtol=1e-6)


# ---- the sampler end to end -------------------------------------------------------------------------
def metadata(requests, uniforms, num_logprobs, mode):
    rows = len(requests)
    return SamplingMetadata(
        temperature=np.array([r.sampling_params.temperature for r in requests], np.float64),
        top_k=np.zeros(rows, np.int64), top_p=np.ones(rows), min_p=np.zeros(rows), uniforms=uniforms,
        banned=banned_pairs(requests), penalties=penalty_inputs(requests),
        num_logprobs=num_logprobs, logprobs_mode=mode,
    )


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs"])
@pytest.mark.parametrize("seed", SEEDS)
def test_sample_end_to_end_against_reference(seed, mode):
    requests, logits = make_requests(seed)
    processed = reference_processed(logits, requests).astype(np.float64)
    temperature = np.array([r.sampling_params.temperature for r in requests])
    scaled = processed / np.where(temperature > 0, temperature, 1.0)[:, None]  # greedy rows: T = 1
    rng = np.random.default_rng(100 + seed)
    uniforms = rng.random(ROWS)
    num_logprobs = np.array([[-1, 0, 1, 5][row % 4] for row in range(ROWS)], np.int64)

    out = sample(paddle.to_tensor(logits), metadata(requests, uniforms, num_logprobs, mode))

    for row in range(ROWS):
        token = int(out.token_ids[row])
        assert np.isfinite(processed[row, token]), f"row {row}: banned token {token} chosen"
        if temperature[row] == 0:
            assert token == int(np.argmax(processed[row])), f"row {row}: greedy is not the reference argmax"
        else:  # inverse CDF of softmax(processed / T) in token-id order at the row's uniform
            p = np.exp(log_softmax(scaled[row]))
            assert token == min(int(np.searchsorted(np.cumsum(p), uniforms[row], side="right")), VOCAB - 1)
        lp = out.logprobs[row]
        if num_logprobs[row] < 0:
            assert lp is None
            continue
        reference = log_softmax(scaled[row] if mode == "processed_logprobs" else logits[row])
        np.testing.assert_allclose(lp.token_logprobs, [reference[token]], atol=1e-5, rtol=0)
        k = int(num_logprobs[row])
        top = np.argsort(-reference, kind="stable")[:k]
        assert lp.top_ids.shape == (1, k) and lp.top_ids[0].tolist() == top.tolist()
        np.testing.assert_allclose(lp.top_logprobs[0], reference[top], atol=1e-5, rtol=0)


# ---- bad words --------------------------------------------------------------------------------------
class FakeTokenizer:
    VOCAB = {"foo": [5], " foo": [6], "foo bar": [5, 7], " foo bar": [6, 7], "  foo bar": [3, 6, 7], "a b c": [1, 2, 3],
             " a b c": [9, 2, 3], "huge": [900], " huge": [901], "odd": [], " odd": [4]}

    def encode(self, text, add_special_tokens=False):
        assert add_special_tokens is False
        return list(self.VOCAB[text])


def test_bad_words_token_ids_tokenizes_each_word_as_given_and_with_a_leading_space():
    seqs = bad_words.bad_words_token_ids(FakeTokenizer(), ["foo", "  foo bar", "a b c", "huge", "odd"], [8, 5], 500)
    # "  foo bar": as given, and with exactly one leading space (" foo bar"); "odd" as given is empty
    assert set(seqs) == {(5,), (6,), (3, 6, 7), (6, 7), (1, 2, 3), (9, 2, 3), (4,), (8,)}
    assert seqs == sorted(set(seqs))  # no duplicates ((5,) from both "foo" and extra id 5)


def test_bad_words_token_ids_drops_words_outside_the_vocabulary():
    assert bad_words.bad_words_token_ids(FakeTokenizer(), ["huge"], [], 500) == []
    assert bad_words.bad_words_token_ids(FakeTokenizer(), ["huge"], [], 902) == [(900,), (901,)]


@pytest.mark.parametrize(
    "output, expected",
    [
        ([], {5, 6}),  # one-token words always; nothing to continue yet
        ([6], {5, 6, 7}),  # output ends with " foo": " foo bar" would complete -> ban 7
        ([1, 2], {5, 6, 3}),  # ends with "a b" -> ban 3
        ([9, 2], {5, 6, 3}),
        ([1, 2, 8], {5, 6}),  # the prefix is not at the end
        ([2], {5, 6}),  # only part of the prefix
        ([6, 7, 1], {5, 6}),
        ([4, 6, 1, 2], {5, 6, 3}),
    ],
)
def test_banned_now_bans_the_last_token_of_a_word_whose_prefix_ends_the_output(output, expected):
    seqs = [(5,), (6,), (6, 7), (1, 2, 3), (9, 2, 3)]
    assert set(bad_words.banned_now(seqs, output)) == expected


def test_bad_words_with_the_real_tokenizer(smollm_llm):
    tokenizer = smollm_llm.get_tokenizer()
    vocab = smollm_llm.llm_engine.config.model_config.vocab_size
    words = ["Paris", "New York", "ineffable"]
    seqs = bad_words.bad_words_token_ids(tokenizer, words, [], vocab)
    expected = {tuple(tokenizer.encode(v, add_special_tokens=False)) for w in words for v in (w, " " + w)}
    assert set(seqs) == expected
    assert any(len(s) > 1 for s in seqs)
    singles = {s[0] for s in seqs if len(s) == 1}
    assert set(bad_words.banned_now(seqs, [])) == singles
    for seq in seqs:
        assert set(bad_words.banned_now(seqs, [11] + list(seq[:-1]))) >= {seq[-1], *singles}
        if len(seq) > 1:  # only part of the prefix generated: seq does not ban its last token
            assert bad_words.banned_now([seq], [11] + list(seq[1:-1])) == []


def test_generate_never_emits_a_bad_word(smollm_llm):
    from fastdeploy import SamplingParams

    prompt = "The capital of France is the city of"
    tokenizer = smollm_llm.get_tokenizer()
    plain = smollm_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6), use_tqdm=False)[0]
    assert "Paris" in plain.outputs.text  # the word the ban must remove
    seqs = bad_words.bad_words_token_ids(tokenizer, ["Paris"], [], len(tokenizer))
    banned = smollm_llm.generate(prompt, SamplingParams(temperature=0, max_tokens=6, bad_words=["Paris"]),
                                 use_tqdm=False)[0]
    ids = banned.outputs.token_ids
    for seq in seqs:
        assert not any(tuple(ids[i:i + len(seq)]) == seq for i in range(len(ids))), (seq, ids)


# ---- logprobs ---------------------------------------------------------------------------------------
def reference_logprobs(logits: np.ndarray, token_ids: np.ndarray, k: int):
    lp = log_softmax(logits)
    vocab = logits.shape[1]
    top_ids = np.stack([np.lexsort((np.arange(vocab), -row))[:k] for row in logits])  # ties: lower id first
    ranks = lambda row, v: 1 + int((row > v).sum())  # noqa: E731
    top_ranks = np.array([[ranks(row, row[t]) for t in ids] for row, ids in zip(logits, top_ids)], np.int64)
    token_ranks = np.array([ranks(row, row[t]) for row, t in zip(logits, token_ids)], np.int64)
    chosen = lp[np.arange(len(logits)), token_ids]
    return top_ids.reshape(len(logits), k), np.take_along_axis(lp, top_ids.reshape(len(logits), k), 1), top_ranks.reshape(len(logits), k), chosen, token_ranks


@pytest.mark.parametrize("k", [0, 1, 5, 64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_compute_logprobs_matches_reference(seed, k):
    rng = np.random.default_rng(seed)
    m, vocab = 6, 64
    logits = rng.normal(0, 4, size=(m, vocab)).astype(np.float32)
    token_ids = rng.integers(0, vocab, size=m)
    got = logprobs.compute_logprobs(logits, token_ids, k)
    top_ids, top_lp, top_ranks, chosen, token_ranks = reference_logprobs(logits, token_ids, k)
    assert got.top_ids.shape == (m, k) and got.top_ids.dtype == np.int64
    np.testing.assert_array_equal(got.top_ids, top_ids)
    np.testing.assert_allclose(got.top_logprobs, top_lp, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got.top_ranks, top_ranks)
    np.testing.assert_allclose(got.token_logprobs, chosen, atol=1e-5, rtol=0)
    np.testing.assert_array_equal(got.token_ranks, token_ranks)


@pytest.mark.parametrize("k", [1, 5, 20, 39])
def test_compute_logprobs_with_banned_tokens_and_widely_spread_logits(k):
    """-inf entries (banned tokens in processed mode) tie among themselves; k may exceed the finite
    tokens. Logits spread over thousands of units are handled like any others."""
    rng = np.random.default_rng(k)
    logits = np.stack([rng.normal(0, 1000, 40), rng.normal(0, 0.01, 40), rng.normal(0, 3, 40)]).astype(np.float32)
    logits[2, rng.choice(40, 30, replace=False)] = -np.inf
    logits[0, 7] = logits[0, 3]  # an exact tie
    token_ids = np.array([3, 0, int(np.flatnonzero(np.isfinite(logits[2]))[0])])
    got = logprobs.compute_logprobs(logits, token_ids, k)
    top_ids, top_lp, top_ranks, chosen, token_ranks = reference_logprobs(logits, token_ids, k)
    np.testing.assert_array_equal(got.top_ids, top_ids)
    np.testing.assert_allclose(got.top_logprobs, top_lp, atol=1e-5, rtol=1e-6)  # float32 outputs near -1000
    np.testing.assert_array_equal(got.top_ranks, top_ranks)
    np.testing.assert_allclose(got.token_logprobs, chosen, atol=1e-5, rtol=1e-6)  # float32 outputs near -1000
    np.testing.assert_array_equal(got.token_ranks, token_ranks)


def test_compute_logprobs_with_a_large_k_is_clamped_to_the_vocabulary():
    logits = np.random.default_rng(5).normal(size=(3, 10)).astype(np.float32)
    got = logprobs.compute_logprobs(logits, np.array([0, 1, 2]), 1000)
    np.testing.assert_array_equal(got.top_ids, np.argsort(-logits, axis=1))
    np.testing.assert_allclose(np.exp(got.top_logprobs.astype(np.float64)).sum(axis=1), 1.0, rtol=1e-5)


def test_compute_logprobs_ties_share_a_rank_and_list_the_lower_id_first():
    logits = np.array([[1.0, 3.0, 3.0, 0.0, 2.0, 0.0]], np.float32)
    for k, ids, ranks in [(6, [1, 2, 4, 0, 3, 5], [1, 1, 3, 4, 5, 5]), (3, [1, 2, 4], [1, 1, 3])]:
        got = logprobs.compute_logprobs(logits, np.array([2]), k)
        assert got.top_ids[0].tolist() == ids and got.top_ranks[0].tolist() == ranks
        assert got.token_ranks[0] == 1  # token 2 ties with token 1: nothing strictly larger
    got = logprobs.compute_logprobs(logits, np.array([5]), 0)
    assert got.token_ranks[0] == 5  # four tokens strictly above 0.0; its tie (token 3) does not count


def test_compute_logprobs_ties_cut_by_k_keep_the_lower_id():
    """A tie straddling the top-k cut: the documented order (ties: lower id first) keeps the lower id."""
    got = logprobs.compute_logprobs(np.array([[0.0, 3.0, 2.0, 3.0, 1.0, 3.0, 3.0]], np.float32), np.array([0]), 3)
    assert got.top_ids[0].tolist() == [1, 3, 5] and got.top_ranks[0].tolist() == [1, 1, 1]
    rng = np.random.default_rng(0)
    for _ in range(300):
        vocab = int(rng.integers(3, 40))
        logits = rng.integers(0, 5, size=(1, vocab)).astype(np.float32)
        k = int(rng.integers(1, vocab))
        got = logprobs.compute_logprobs(logits, np.array([0]), k)
        expected = np.lexsort((np.arange(vocab), -logits[0]))[:k]
        assert got.top_ids[0].tolist() == expected.tolist(), (logits[0].tolist(), k)
