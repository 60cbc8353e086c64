"""ERNIE-4.5-VL: the vision transformer, the resampler and the multimodal MoE decoder (model.py)."""
from fastdeploy.model_executor.models.ernie4_5_vl.model import Ernie4_5_VLMoeForConditionalGeneration

__all__ = ["Ernie4_5_VLMoeForConditionalGeneration"]
