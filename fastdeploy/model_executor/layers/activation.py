"""SwiGLU activation (Shazeer 2020): silu(gate) * up on a fused [gate | up] projection."""
import paddle
import paddle.nn.functional as F


def silu_and_mul(gate_up: paddle.Tensor) -> paddle.Tensor:
    # gate_up: [num_tokens, 2 * intermediate] -> [num_tokens, intermediate]
    # F.swiglu with one input splits it in halves itself: no chunk copies (~20% faster on CPU).
    return F.swiglu(gate_up)
