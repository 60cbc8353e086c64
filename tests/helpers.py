"""Helpers for the end-to-end tests on the default model, through the public API only.

Tests derive what they expect from the live output (token boundaries, first occurrences, the
unstopped run) instead of hard-coding one model's continuation; the pieces they share live here.
"""
from __future__ import annotations

from fastdeploy import SamplingParams

STORY = "Once upon a time"  # a plain-text prompt whose continuation the tests read, never assume
STORY_TOKENS = 12
SMOLLM_MAX_MODEL_LEN = 1024  # the session smollm_llm's settings (conftest.py)
SMOLLM_BLOCK_SIZE = 16
NEAR_TIE = 1e-3  # top-2 logit gap below which float rounding may legitimately pick either token


def greedy(max_tokens: int = STORY_TOKENS, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, **kwargs)


def story_params(**kwargs) -> SamplingParams:
    """Greedy over STORY_TOKENS tokens with EOS ignored: the unstopped run always has that length."""
    return greedy(STORY_TOKENS, ignore_eos=True, **kwargs)


def run(llm, prompts, params) -> list:
    """llm.generate without a progress bar; a list of token-id lists goes as prompt_token_ids dicts."""
    if isinstance(prompts, list) and prompts and isinstance(prompts[0], list):
        prompts = [{"prompt_token_ids": p} for p in prompts]
    return llm.generate(prompts, params, use_tqdm=False)


def chat(llm, conversations, params) -> list:
    return llm.chat(conversations, params, use_tqdm=False)


def first(llm, prompt, params):
    """The first CompletionOutput of one prompt."""
    return run(llm, prompt, params)[0].outputs


def contains(ids: list[int], seq) -> bool:
    seq = list(seq)
    return any(ids[i : i + len(seq)] == seq for i in range(len(ids) - len(seq) + 1))


def token_offsets(tok, ids: list[int]) -> list:
    """offsets[k] = len(decode(ids[:k])) where that decoding is a prefix of decode(ids), else None
    (a token boundary inside a multi-byte character); len(ids) + 1 entries."""
    full = tok.decode(ids, skip_special_tokens=True)
    out = []
    for k in range(len(ids) + 1):
        head = tok.decode(ids[:k], skip_special_tokens=True)
        out.append(len(head) if full.startswith(head) else None)
    return out


def top2_gaps(completion) -> list[float]:
    """Top-2 logprob gap (= logit gap) at each generated position of a run with logprobs >= 2."""
    out = []
    for entry in completion.logprobs:
        values = sorted((lp.logprob for lp in entry.values()), reverse=True)
        out.append(values[0] - values[1] if len(values) > 1 else float("inf"))
    return out


def assert_same_greedy(ours: list[int], ref: list[int], gaps: list[float], what: str = "") -> None:
    """Identical greedy token ids, except that from a near-tie of the reference on they may differ."""
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            assert gaps[i] < NEAR_TIE, f"{what} token {i}: got {a}, reference {b}, top-2 gap {gaps[i]:.2e}"
            return
    assert len(ours) == len(ref), f"{what} lengths differ: got {len(ours)}, reference {len(ref)}"


# ---- engine internals ----------------------------------------------------------------------------
# The public API can neither see the KV block pool nor abort one request. The few tests that must
# read them go through these two helpers, so a restructured engine core changes them here only.
def blocks_in_use(llm) -> int:
    pool = llm.llm_engine.block_pool
    return pool.num_usable_blocks - pool.num_free_blocks


def assert_engine_idle(llm) -> None:
    """No request left, every KV block free, no block referenced (no leak, no negative count)."""
    engine = llm.llm_engine
    assert not engine.has_unfinished_requests() and engine.output_processor.groups == {}
    assert blocks_in_use(llm) == 0
    assert all(c == 0 for c in engine.block_pool.ref_counts)
