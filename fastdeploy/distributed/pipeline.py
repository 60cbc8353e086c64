"""How a checkpoint is cut into pipeline stages (GPipe's layer partition, Huang et al. 2019; vLLM's split).

Stage s of P holds a contiguous range of decoder layers (`parallel_state.stage_layers`: L // P each,
the L % P left over one each to the stages before the last, from the second-to-last backwards), the
first stage also the embedding, the last the final norm and lm_head (with tied embeddings the last
stage reads the embedding's tensor into its lm_head, as one process does). Within a stage the
layers are split over its tensor-parallel ranks as without stages (distributed/sharding.py).
"""
from __future__ import annotations

import re
from typing import Iterable, Iterator

from fastdeploy.config import VL_ARCHITECTURES, ModelConfig
from fastdeploy.distributed.parallel_state import PipelineStage, stage_layers

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def check_pipeline_parallel(config: ModelConfig, size: int) -> None:
    """ValueError naming the numbers when the model cannot be cut into `size` stages (before loading):
    more stages than decoder layers, or a model stages do not serve yet (ERNIE-4.5-VL's vision tower
    and M-RoPE, BERT-style encoders)."""
    stage_layers(config.num_hidden_layers, size)
    if config.encoder_only or config.architecture in VL_ARCHITECTURES:
        raise ValueError(f"pipeline_parallel_size={size}: {config.architecture} is not supported by pipeline "
                         "parallelism yet (decoder-only text models are); use tensor_parallel_size")


def stage_weights(weights: Iterable[tuple[str, object]], stage: PipelineStage,
                  config: ModelConfig) -> Iterator[tuple[str, object]]:
    """The (checkpoint name, tensor) pairs stage `stage` loads, from the checkpoint's stream: its
    layers', the embedding on the first stage (and on the last when tied: lm_head reads it), the final
    norm and lm_head on the last."""
    for name, tensor in weights:
        layer = _LAYER.match(name)
        if layer is not None:
            keep = int(layer.group(1)) in stage.layers
        elif name == "model.embed_tokens.weight":
            keep = stage.is_first or (stage.is_last and config.tie_word_embeddings)
        elif name.startswith(("model.norm.", "lm_head.")):
            keep = stage.is_last
        else:
            keep = True
        if keep:
            yield name, tensor
