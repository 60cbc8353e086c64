"""bad_words: words the output must never contain, as token-id sequences (vLLM's rule).

Each word is tokenized as given and with one leading space (a word mid-sentence is usually a
different token than at the start); duplicates are dropped. The sampler bans them step by step
(model_executor/layers/sample/bad_words.py).
"""


def bad_words_token_ids(tokenizer, words: list[str], extra_ids: list[int], vocab_size: int) -> list[tuple]:
    """Token-id sequences to ban: each word's tokenizations plus `extra_ids` as one-token words.

    Sequences holding ids outside the model's vocabulary are dropped (they cannot be generated).
    """
    sequences = {(int(t),) for t in extra_ids}
    for word in words:
        for variant in (word, " " + word.lstrip()):
            ids = tuple(tokenizer.encode(variant, add_special_tokens=False))
            if ids and all(t < vocab_size for t in ids):
                sequences.add(ids)
    return sorted(sequences)
