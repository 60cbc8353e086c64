"""Which input processor a checkpoint gets: the one place that tells multimodal checkpoints apart.

A checkpoint is multimodal by its architecture (config.json `architectures[0]`), as FastDeploy decides
it from its model registry's category (`enable_mm` is not needed): ERNIE-4.5-VL's transformers and
Paddle checkpoints both name `Ernie4_5_VLMoeForConditionalGeneration`.
"""
from __future__ import annotations

from fastdeploy.config import VL_ARCHITECTURES, FDConfig
from fastdeploy.input.input_processor import InputProcessor



def complete_hf_config(hf_config: dict, tokenizer) -> dict:
    """config.json with what the model reads from the tokenizer: an ERNIE-4.5-VL checkpoint gets its
    special token ids resolved once (models/ernie4_5_vl/config.py `with_token_ids`; ValueError when
    one is in neither), so its model and its input processor use the same ids. Others: unchanged."""
    architectures = hf_config.get("architectures") or []
    if architectures and architectures[0] in VL_ARCHITECTURES:
        from fastdeploy.model_executor.models.ernie4_5_vl.config import with_token_ids

        return with_token_ids(hf_config, tokenizer)
    return hf_config


def make_input_processor(fd_config: FDConfig, tokenizer) -> InputProcessor:
    """VLInputProcessor for an ERNIE-4.5-VL checkpoint, else the text InputProcessor."""
    if fd_config.model_config.architecture in VL_ARCHITECTURES:
        from fastdeploy.input.vl_processor import VLInputProcessor

        return VLInputProcessor(fd_config, tokenizer)
    return InputProcessor(fd_config, tokenizer)
