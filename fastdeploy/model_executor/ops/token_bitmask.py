"""Token-bitmask shim: the compiled `fd_apply_token_bitmask_` op (custom_ops/cpu_ops/token_bitmask.cc)
or its numpy reference (layers/sample/token_bitmask.py). Both work in place on the sampler's numpy view
of the logits."""
import numpy as np

from fastdeploy.model_executor.host_arrays import as_paddle
from fastdeploy.model_executor.layers.sample.token_bitmask import apply_token_bitmask
from fastdeploy.model_executor.ops.loader import compiled_op


def apply_token_bitmask_(logits: np.ndarray, bitmask: np.ndarray, indices: np.ndarray) -> None:
    """Mask logits [rows, vocab] float32 in place: row indices[i] keeps only the tokens bitmask [m, words]
    int32 row i allows (bit t % 32 of word t // 32), the others become -inf. A non-contiguous `logits`
    runs the reference (the op writes through the array's buffer)."""
    op = compiled_op("fd_apply_token_bitmask_")
    if op is None or not logits.flags.c_contiguous:
        apply_token_bitmask(logits, bitmask, indices)
        return
    op(as_paddle(logits), as_paddle(np.ascontiguousarray(bitmask, dtype=np.int32)),
       as_paddle(np.asarray(indices, dtype=np.int64)))
