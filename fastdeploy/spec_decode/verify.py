"""The acceptance rule of a verification step: which of a request's drafts it keeps.

A request that verifies drafts d_1..d_k gets k + 1 rows of logits: row j is the target model's
next-token distribution after the sequence extended by d_1..d_j. Each row is sampled as a normal step
would (the same penalties, bans and filters with the output extended by the drafts before it, the
same per-position uniform number for seeded requests), giving targets t_0..t_k. Drafts are accepted
while they equal the targets: the tokens kept are t_0..t_a, where a is the first j with t_j != d_{j+1}
(or k when every draft matched, t_k then being the bonus token).

This is FastDeploy's `target_match` rule. It keeps the target distribution exactly for any draft
that does not depend on the target's random numbers (n-gram lookups, a draft model's greedy
choice): each kept token is a draw from the target's distribution given the tokens before it, and
a row is only used when those tokens are what the non-speculative decode would have had. For such
one-hot drafts it is the same law as the rejection rule of Leviathan et al. (arXiv 2211.17192,
accept d with probability p(d), else draw from p without d). Greedy requests accept the longest
prefix of drafts equal to the argmax.
"""
from __future__ import annotations


def accepted_tokens(targets: list[int], drafts: list[int]) -> list[int]:
    """The tokens a verification keeps: targets [k + 1] up to and including the first that differs
    from its draft (drafts [k]); all k + 1 when every draft matched."""
    for j, draft in enumerate(drafts):
        if targets[j] != draft:
            return targets[: j + 1]
    return targets[: len(drafts) + 1]


def num_rejected(drafts: list[int], kept: list[int]) -> int:
    """Drafts a verification threw away: all but those `kept` (accepted drafts, then one sampled token)."""
    return len(drafts) - (len(kept) - 1)
