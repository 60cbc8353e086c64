"""Model registry: config.json `architectures[0]` -> model class."""
from fastdeploy.model_executor.models.llama import LlamaForCausalLM

MODEL_REGISTRY = {
    "LlamaForCausalLM": LlamaForCausalLM,
}


def get_model_class(architecture: str):
    """The class for `architecture`; raises ValueError listing the supported ones."""
    if architecture not in MODEL_REGISTRY:
        raise ValueError(
            f"architecture {architecture!r} is not supported; supported: {sorted(MODEL_REGISTRY)}"
        )
    return MODEL_REGISTRY[architecture]
