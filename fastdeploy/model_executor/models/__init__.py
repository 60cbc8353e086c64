"""Model registry: config.json `architectures[0]` -> model class."""
from fastdeploy.model_executor.models.ernie4_5 import Ernie4_5ForCausalLM
from fastdeploy.model_executor.models.ernie4_5_moe import Ernie4_5_MoeForCausalLM
from fastdeploy.model_executor.models.llama import LlamaForCausalLM
from fastdeploy.model_executor.models.qwen2 import Qwen2ForCausalLM
from fastdeploy.model_executor.models.qwen3 import Qwen3ForCausalLM
from fastdeploy.model_executor.models.qwen3_moe import Qwen3MoeForCausalLM

MODEL_REGISTRY = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "Ernie4_5ForCausalLM": Ernie4_5ForCausalLM,
    "Ernie4_5_MoeForCausalLM": Ernie4_5_MoeForCausalLM,
    # the spelling of Baidu's own (remote-code and Paddle-layout) ERNIE-4.5 configs
    "Ernie4_5_ForCausalLM": Ernie4_5ForCausalLM,
}


def get_model_class(architecture: str):
    """The class for `architecture`; raises ValueError listing the supported ones."""
    if architecture not in MODEL_REGISTRY:
        raise ValueError(
            f"architecture {architecture!r} is not supported; supported: {sorted(MODEL_REGISTRY)}"
        )
    return MODEL_REGISTRY[architecture]
