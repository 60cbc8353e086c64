"""Which format the model's weights are held and multiplied in, from `LLM(dtype=..., quantization=...)`.

`resolve_weight_format` is the one place that decides, before the model is built:

  * a GGUF file: its blocks, as stored (the header's GGUFConfig), or with `dtype="bfloat16"` the blocks
    dequantized at load and held in bf16 (batches then run the bf16 GEMM, AMX tiles where the CPU has
    them, instead of the GGUF kernels' float32 math); `quantization` is refused (the file is quantized
    already);
  * `quantization="wint8" | "wint4"` (FastDeploy's names; float checkpoints): weight-only int8 per
    output feature / asymmetric int4 per group of 32 inputs (layers/quantization/packed.py);
  * `dtype="bfloat16"`: weights held in bf16;
  * `dtype="float32"`: dense float32, exactly (the mode the parity tests use);
  * `dtype="float16"` (vLLM's name for fp16 checkpoints): dense float32 too, holding the float16
    values exactly (the CPU has no fast float16 matmul); `"bfloat16"` halves their memory instead;
  * `dtype="auto"` (the default): the checkpoint's dtype (config.json's `torch_dtype`, or `dtype` in
    Paddle checkpoints and transformers 5): bf16 checkpoints are held in bf16 where the CPU has
    AVX512-BF16 or AMX-BF16 (`vdpbf16ps` / tiles run the op at full speed), float32 otherwise; float16
    and float32 checkpoints in float32.

The packed formats need the compiled `fd_packed_linear` op; without it (no compiler, fallbacks forced)
every format but GGUF is float32, with a warning when the user asked for another.

The KV pool is sized from the bytes the weights will hold: `ModelConfig.weight_bytes` at the format's
bytes per weight, or for a GGUF file kept in its blocks `gguf_held_bytes`, read off the file's header.
"""
import logging
import math
from dataclasses import dataclass
from typing import Optional

from fastdeploy.model_executor.layers.linear import QuantConfig
from fastdeploy.model_executor.layers.quantization.packed import KIND_IDS, PackedConfig
from fastdeploy.model_executor.ops import compiled_op

logger = logging.getLogger("fastdeploy")

BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# bytes per weight of a linear layer in each format (wint8: with its float32 scales, for 1024 inputs)
BYTES_PER_WEIGHT = {"float32": 4.0, "bfloat16": 2.0, "wint8": 1.0 + 4 / 1024, "wint4": 0.5 + 8 / 32}


def _cpu_flags(cpuinfo: str) -> set[str]:
    """The first processor's ISA flags in `cpuinfo` (empty when unreadable)."""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return set(line.split(":", 1)[-1].split())
    except OSError:
        pass
    return set()


def cpu_has_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU multiplies bf16 natively (AVX512-BF16 or AMX-BF16)."""
    return bool(_cpu_flags(cpuinfo) & set(BF16_CPU_FLAGS))


def cpu_has_amx_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU has AMX-BF16 tiles (Intel Xeon from Sapphire Rapids; not AMD Zen 4)."""
    return "amx_bf16" in _cpu_flags(cpuinfo)


def checkpoint_dtype(hf_config: dict) -> str:
    """The dtype config.json names for the checkpoint's tensors ("float32" when it names none)."""
    return str(hf_config.get("torch_dtype") or hf_config.get("dtype") or "float32")


@dataclass
class WeightFormat:
    """name: "gguf", "float32", "bfloat16", "wint8" or "wint4"; quant_config: what the model's build
    gets (None: dense float32); bytes_per_weight: of the linear layers and lm_head, for sizing the KV
    pool (GGUF: unused, see gguf_held_bytes); kv_cache_dtype: the KV cache's dtype, the compute
    dtype (bf16 for bf16, wint8 and wint4, whose matmuls run in bf16; float32 for float32 and GGUF)."""

    name: str
    quant_config: Optional[QuantConfig]

    @property
    def bytes_per_weight(self) -> float:
        return BYTES_PER_WEIGHT.get(self.name, 4.0)

    @property
    def kv_cache_dtype(self) -> str:
        return "bfloat16" if self.name in ("bfloat16", "wint8", "wint4") else "float32"

    @property
    def lm_head_bytes_per_weight(self) -> float:
        return BYTES_PER_WEIGHT["wint8"] if self.name == "wint4" else self.bytes_per_weight


def gguf_held_bytes(file) -> int:
    """Bytes of the weights a model loaded from GGUF `file` (model_loader/gguf_file.py GGUFFile) holds,
    from the header alone, tensor by tensor as the loader hands them over (gguf_loader.hf_tensors: an
    expert stack as its experts): a matrix in its blocks (2-D, of a type in quantized.LINEAR_QTYPES) at
    the size of the op's layout (quantized.block_shape: the file's bytes for the row-major types; Q4_0,
    Q4_1, Q8_0 interleaved with float32 scales, +6% for Q8_0, +11% Q4_0, +20% Q4_1), every other tensor
    at 4 bytes per value (read as float32 at load). The embedding is held once in its blocks when its type
    allows and `gguf_embedding` is compiled (layers/embeddings.py: `GGUFEmbedding`, or tied, no
    output.weight, lm_head's blocks read by `TiedEmbedding`); else it is looked up in float32 (4 bytes per
    value) and, when tied, also held as lm_head.
    Without the compiled GGUF ops every matrix is float32. A packed projection (q/k/v, gate/up) whose
    parts differ in type is held in segments (gguf.py SegmentedGGUFLinearMethod): its parts' sizes,
    counted here, plus a header and padding to 64 bytes per part, not counted."""
    from fastdeploy.model_executor.model_loader.gguf_loader import hf_tensors
    from fastdeploy.model_executor.model_loader.quantized import LINEAR_QTYPES, block_shape

    in_blocks = compiled_op("gguf_linear") is not None and compiled_op("gguf_interleave_rows") is not None
    tied = not any(t.name == "output.weight" for t in file.tensors)

    def as_linear(tensor) -> int:
        if in_blocks and int(tensor.tensor_type) in LINEAR_QTYPES and len(tensor.shape) == 2:
            return math.prod(block_shape(int(tensor.tensor_type), tensor.shape[1], tensor.shape[0]))
        return 4 * math.prod(tensor.shape)

    def as_embedding(tensor) -> int:
        if in_blocks and compiled_op("gguf_embedding") is not None and int(tensor.tensor_type) in LINEAR_QTYPES:
            return as_linear(tensor)  # one copy of the blocks (tied: lm_head's)
        return 4 * math.prod(tensor.shape) + (as_linear(tensor) if tied else 0)

    return sum(as_embedding(tensor) if tensor.name == "token_embd.weight" else as_linear(tensor)
               for _, tensor in hf_tensors(file))


def resolve_weight_format(dtype: str, quantization: Optional[str], hf_config: dict,
                          source_quant_config: Optional[QuantConfig], cpu_bf16: Optional[bool] = None) -> WeightFormat:
    """The format for this checkpoint and these settings (see the module docstring); cpu_bf16 overrides
    the CPU probe (tests). dtype and quantization were validated by EngineArgs; ValueError for settings
    this checkpoint cannot take. Tensor parallelism keeps the format: each rank packs its own shard
    (distributed/sharding.py)."""
    if source_quant_config is not None:  # GGUF
        if quantization is not None:
            raise ValueError(f"quantization={quantization!r} applies to float checkpoints (HF or Paddle "
                             "safetensors); this GGUF file is quantized already: leave quantization unset")
        if dtype != "bfloat16":
            return WeightFormat("gguf", source_quant_config)
    if quantization is not None:
        wanted = quantization
    elif dtype == "bfloat16":
        wanted = "bfloat16"
    elif dtype == "auto" and checkpoint_dtype(hf_config) == "bfloat16":
        wanted = "bfloat16" if (cpu_has_bf16() if cpu_bf16 is None else cpu_bf16) else "float32"
    else:
        wanted = "float32"
    if wanted == "float32":
        return WeightFormat("float32", None)
    if compiled_op("fd_packed_linear") is None:
        if dtype != "auto" or quantization is not None:
            logger.warning("dtype=%r quantization=%r need the compiled custom ops, which are unavailable: the "
                           "weights are held in float32", dtype, quantization)
        return WeightFormat("float32", None)
    return WeightFormat(wanted, PackedConfig(KIND_IDS[wanted]))
