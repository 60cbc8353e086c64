"""Activation shims: SwiGLU (Shazeer 2020; custom_ops/cpu_ops/swiglu.cc, or Paddle's F.swiglu) and
QuickGELU (custom_ops/cpu_ops/quick_gelu.cc, or Paddle ops)."""
import paddle
import paddle.nn.functional as F

from fastdeploy.model_executor.ops.loader import compiled_op


def silu_and_mul(gate_up: paddle.Tensor) -> paddle.Tensor:
    """silu(gate) * up of a fused [gate | up] projection, silu(g) = g / (1 + exp(-g)).

    gate_up: [n, 2 * inter] float32 (gate = gate_up[:, :inter], up = gate_up[:, inter:]) -> [n, inter].
    Reference: Paddle's F.swiglu with one input, which splits it in halves itself. The compiled op
    is within 2e-6 relative of float64 math for gates in [-80, 80]; below -87 it returns ~0 instead
    of values under 1e-35 in magnitude.
    """
    return activation_kernel("swiglu")(gate_up)


def quick_gelu(x: paddle.Tensor) -> paddle.Tensor:
    """x * sigmoid(1.702 x) elementwise (transformers' QuickGELUActivation), any shape, float32.

    The compiled op makes one pass over memory (the fallback's Paddle ops three) and is within 2e-6
    relative of float64 math for x in [-50, 80]; below -51 it returns ~x * 1e-38 (|out| < 1e-35).
    """
    return activation_kernel("quick_gelu")(x)


def quick_gelu_reference(x: paddle.Tensor) -> paddle.Tensor:
    """QuickGELU in Paddle ops (the compiled op's fallback)."""
    return x * F.sigmoid(1.702 * x)


def activation_kernel(name: str):
    """The callable for a Linear's activation `name` ("quick_gelu", "swiglu"), chosen now (the compiled op, or
    its Paddle reference when the ops are unavailable or forced off), as the other layers choose their
    kernels when they are built."""
    if name == "swiglu":
        return compiled_op("fd_silu_and_mul") or F.swiglu
    if name == "quick_gelu":
        return compiled_op("fd_quick_gelu") or quick_gelu_reference
    raise ValueError(f"no activation kernel named {name!r}")
