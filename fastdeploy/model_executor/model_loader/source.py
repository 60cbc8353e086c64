"""What a model loader hands the engine: config, tokenizer and a stream of weights (HF names)."""
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional


@dataclass
class ModelSource:
    """A model opened from disk, weights not yet read.

    Attributes:
        hf_config: config.json as a dict (for GGUF: built from the metadata).
        generation_config: generation_config.json as a dict ({} when absent).
        tokenizer: a transformers tokenizer with its chat template (None if it has none).
        weights: yields (Hugging Face parameter name, float32 numpy array in HF layout [out, in], or a
            GGUF `QuantizedTensor` of that shape) one tensor at a time, so loading never holds two
            copies of the model.
        quant_config: how the tensors are stored, for the model's build (layers/linear.py QuantConfig;
            a GGUFConfig from the GGUF header), or None for float checkpoints.
    """

    hf_config: dict
    generation_config: dict
    tokenizer: Any
    weights: Callable[[], Iterator[tuple[str, Any]]]
    quant_config: Optional[Any] = None
