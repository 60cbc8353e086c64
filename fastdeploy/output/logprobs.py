"""Logprobs arrays -> the public {token_id: Logprob} dicts, with each token's text decoded once."""
from fastdeploy.engine.request import Logprob, LogprobsDict
from fastdeploy.model_executor.layers.sample.logprobs import LogprobsArrays


class TokenTexts:
    """`tokenizer.decode([token_id])` per token id, cached (the same ids recur every step)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self.cache.get(token_id)
        if text is None:
            text = self.cache[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text


def logprobs_dict(arrays: LogprobsArrays, i: int, token_id: int, texts: TokenTexts) -> LogprobsDict:
    """Position i: the actual token first (vLLM's order), then the top-k not already listed."""
    entries = {token_id: Logprob(float(arrays.token_logprobs[i]), int(arrays.token_ranks[i]), texts(token_id))}
    for tid, lp, rank in zip(arrays.top_ids[i].tolist(), arrays.top_logprobs[i].tolist(), arrays.top_ranks[i].tolist()):
        if tid not in entries:
            entries[tid] = Logprob(lp, rank, texts(tid))
    return entries
