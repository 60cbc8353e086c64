"""Shared by test_penalties.py and test_compute_logprobs.py: random batches of fake requests
(prompts, outputs, penalties, min_tokens, stop ids, bad words) and the dense numpy references
of the sampling layer, written from the documented semantics (FastDeploy's
`get_token_penalty_multi_scores`, SamplingParams' docstring, vLLM's bad-words rule), densely over the
whole vocabulary, independent of the sparse implementation:

  1. repetition penalty r over tokens in prompt or output: l > 0 -> l / r, else l * r;
  2. l -= frequency * count_in_output + presence * [count_in_output > 0];
  3. EOS / stop ids -> -inf while fewer than min_tokens are generated; bad words -> -inf;
  4. division by temperature (greedy rows: none).
"""
from types import SimpleNamespace

import fastdeploy  # noqa: F401  (before paddle)
import numpy as np

from fastdeploy.model_executor.layers.sample import bad_words

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
