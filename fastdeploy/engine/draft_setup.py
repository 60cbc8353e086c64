"""The draft model of speculative_config method "draft_model", resolved once at engine start: its
config, weight format and bytes (the KV pool is sized with its cache: cache_manager/kv_cache_sizing.py),
after the checks that make a draft that cannot serve the target a ValueError before anything loads."""
from __future__ import annotations

from fastdeploy.config import VL_ARCHITECTURES, DraftModelConfig, FDConfig, ModelConfig


def resolve_draft_model(config: FDConfig, tokenizer, dtype: str, quantization) -> DraftModelConfig:
    """The draft named by `config.speculative_config.model`, in the weight format `dtype` and
    `quantization` (the LLM's settings) give it. ValueError when the target is multimodal, when the
    draft's tokenizer differs from the target's (`tokenizer`) or its positions end before
    max_model_len + k."""
    from fastdeploy.input.tokenizer import load_tokenizer
    from fastdeploy.model_executor.layers.quantization.weight_format import gguf_held_bytes, resolve_weight_format
    from fastdeploy.model_executor.model_loader import open_model
    from fastdeploy.model_executor.models import get_model_class

    spec = config.speculative_config
    if config.model_config.architecture in VL_ARCHITECTURES:
        raise ValueError(f"speculative_config['method']='draft_model' serves text models; "
                         f"{config.model_config.architecture} places images by M-RoPE: use 'ngram'")
    path, source = open_model(spec.model)
    draft_config = ModelConfig.from_hf_config(source.hf_config)
    get_model_class(draft_config.architecture)  # ValueError naming the supported architectures
    draft_vocab = load_tokenizer(source).get_vocab()
    if draft_vocab != tokenizer.get_vocab():
        raise ValueError(f"speculative_config['model']={spec.model!r}: the draft's tokenizer ({len(draft_vocab)} "
                         f"tokens) is not the target's ({len(tokenizer.get_vocab())} tokens); a draft model must "
                         "share the target's tokenizer")
    needed = config.scheduler_config.max_model_len + spec.num_speculative_tokens
    if draft_config.max_sequence_length < needed:
        raise ValueError(f"speculative_config['model']={spec.model!r} has {draft_config.max_sequence_length} "
                         f"positions; drafting past max_model_len={config.scheduler_config.max_model_len} by "
                         f"{spec.num_speculative_tokens} tokens needs {needed}: lower max_model_len")
    weight_format = resolve_weight_format(dtype, quantization, source.hf_config, source.quant_config)
    weights_bytes = (gguf_held_bytes(source.gguf_file) if weight_format.name == "gguf" else
                     draft_config.weight_bytes(weight_format.bytes_per_weight, weight_format.lm_head_bytes_per_weight))
    return DraftModelConfig(path, draft_config, weight_format.quant_config, weight_format.kv_cache_dtype, weights_bytes)
