"""Logprobs shim: the compiled op of custom_ops/cpu_ops/logprobs.cc, or its numpy reference,
`compute_logprobs` in layers/sample/logprobs.py."""
import numpy as np

from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.sample.logprobs import LogprobsArrays, compute_logprobs
from fastdeploy.model_executor.ops.loader import compiled_op


def token_logprobs(logits: np.ndarray, token_ids: np.ndarray, k: int) -> LogprobsArrays:
    """Logprobs of `token_ids` [m] (m >= 1) under logits [m, vocab] float32 (not modified), with the top
    min(k, vocab) of each row (most likely first, ties by lower id; ranks count strictly larger logits).

    Reference: `compute_logprobs` (natural log, logsumexp summed in float64); the op agrees within
    1e-5 absolute (its own exp) and exactly on ids and ranks. The reference runs row by row here, so
    its temporaries stay in cache.
    """
    k = min(k, logits.shape[1])
    op = compiled_op("fd_token_logprobs")
    if op is None:
        rows = [compute_logprobs(logits[i : i + 1], token_ids[i : i + 1], k) for i in range(len(logits))]
        return LogprobsArrays(
            top_ids=np.concatenate([r.top_ids for r in rows]),
            top_logprobs=np.concatenate([r.top_logprobs for r in rows]),
            top_ranks=np.concatenate([r.top_ranks for r in rows]),
            token_logprobs=np.concatenate([r.token_logprobs for r in rows]),
            token_ranks=np.concatenate([r.token_ranks for r in rows]),
        )
    ids = np.ascontiguousarray(token_ids, dtype=np.int64)
    outs = op(as_paddle(logits), as_paddle(ids), k)
    return LogprobsArrays(*(t.numpy() for t in outs))
