"""What a model loader hands the engine: config, a stream of weights (HF names), and where the tokenizer is."""
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional


@dataclass
class ModelSource:
    """A model opened from disk, weights not yet read.

    Attributes:
        hf_config: config.json as a dict (for GGUF: built from the metadata).
        generation_config: generation_config.json as a dict ({} when absent).
        path: the model directory or .gguf file (input/tokenizer.py reads the tokenizer from it).
        weights: yields (Hugging Face parameter name, float32 numpy array in HF layout [out, in], or a
            GGUF `QuantizedTensor` of that shape) one tensor at a time, so loading never holds two
            copies of the model.
        quant_config: how the tensors are stored, for the model's build (layers/linear.py QuantConfig;
            a GGUFConfig from the GGUF header), or None for float checkpoints.
        gguf_file: the open GGUF file (gguf_file.GGUFFile; its metadata also holds the tokenizer), None
            for directories.
    """

    hf_config: dict
    generation_config: dict
    path: Path
    weights: Callable[[], Iterator[tuple[str, Any]]]
    quant_config: Optional[Any] = None
    gguf_file: Optional[Any] = None
