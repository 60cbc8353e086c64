"""bad_words at sampling time (vLLM's rule): per step, a one-token sequence is always banned; for a
longer one its last token is banned when the output so far ends with the sequence's other tokens,
so the whole word can never be completed. The sequences come from input/bad_words.py.
"""


def banned_now(sequences: list[tuple], output_ids: list[int]) -> list[int]:
    """Token ids banned at the next step, given the output so far."""
    banned = []
    for seq in sequences:
        prefix = seq[:-1]
        if not prefix or (len(output_ids) >= len(prefix) and tuple(output_ids[-len(prefix):]) == prefix):
            banned.append(seq[-1])
    return banned
