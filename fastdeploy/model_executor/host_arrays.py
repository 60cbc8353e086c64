"""numpy arrays as Paddle tensors, zero-copy, without Paddle's per-call leak.

Every call of the `paddle.Tensor` constructor in Paddle 3.3 (which `paddle.to_tensor`,
`paddle.from_dlpack` and `EagerParamBase` go through) leaves one Python list behind that is never
freed: ~7-15 lists per engine step, tens of MB an hour in a long batch job, and long-lived small
objects scattered over the heap that keep freed memory from returning after `del llm`. `as_paddle`
wraps the array's DLPack capsule in a DenseTensor (`paddle.base.core.from_dlpack`, no constructor)
and shares it into a tensor made by `paddle.empty`, which leaks nothing.
tests/model_executor/test_host_arrays.py counts the lists; use this, never `paddle.to_tensor` or
`paddle.from_dlpack`, wherever a step turns host arrays into tensors.
"""
import numpy as np
import paddle


def as_paddle(array) -> paddle.Tensor:
    """A paddle.Tensor on the CPU sharing `array`'s memory (same shape and dtype; writes through
    either show in the other). A non-contiguous array (or a list) is copied into a contiguous one
    first. The tensor keeps the array alive through the capsule's deleter."""
    array = np.ascontiguousarray(array)
    dense = paddle.base.core.from_dlpack(array.__dlpack__())
    tensor = paddle.empty([0], dtype="float32")  # a shell: its dtype and shape come from `dense`
    tensor.get_tensor()._share_data_with(dense)
    return tensor
