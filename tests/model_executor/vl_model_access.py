"""Build our ERNIE-4.5-VL model straight from a checkpoint directory and run steps of one sequence
on it, without the engine (so the model side is testable apart from the input side)."""
from pathlib import Path

import numpy as np
import paddle

from fastdeploy.config import ModelConfig
from fastdeploy.input.processors import complete_hf_config
from fastdeploy.input.tokenizer import load_tokenizer
from fastdeploy.model_executor.forward_meta import ForwardMeta
from fastdeploy.model_executor.layers.attention import allocate_kv_cache
from fastdeploy.model_executor.model_loader.hf_loader import open_hf_dir
from fastdeploy.model_executor.models import get_model_class

BLOCK_SIZE = 16


def load_our_model(directory, max_model_len: int = 1024, quant_config=None):
    """quant_config: the weight format's (layers/quantization/weight_format.py; None: float32)."""
    source = open_hf_dir(Path(directory))
    hf_config = complete_hf_config(source.hf_config, load_tokenizer(source))  # as the engine does
    config = ModelConfig.from_hf_config(hf_config)
    model = get_model_class(config.architecture)(config, BLOCK_SIZE, max_model_len, quant_config)
    model.load_weights(source.weights())
    return model


def run_steps(model, steps: list, num_blocks: int = 16, cache_dtype: str = "float32") -> list[np.ndarray]:
    """Run consecutive steps of one sequence; each step (input_ids [k], positions [3, k] or [k],
    inputs_embeds [k, hidden] paddle tensor or None) extends the KV cache (of `cache_dtype`: the
    engine's, CacheConfig.dtype, to reproduce its numbers). Returns the logits [k, vocab] of every step."""
    config = model.config
    caches = [allocate_kv_cache(num_blocks + 1, config.num_key_value_heads, BLOCK_SIZE, config.head_dim, cache_dtype)
              for _ in range(config.num_hidden_layers)]
    done, results = 0, []
    for input_ids, positions, inputs_embeds in steps:
        k = len(input_ids)
        meta = ForwardMeta.build([k], [done], [list(range(1, num_blocks + 1))], BLOCK_SIZE, caches)
        with paddle.no_grad():
            hidden = model(paddle.to_tensor(np.asarray(input_ids, np.int64)),
                           paddle.to_tensor(np.asarray(positions, np.int64)), meta, inputs_embeds)
            results.append(model.compute_logits(hidden).numpy())
        done += k
    return results


def prefill_logits(model, input_ids, positions, inputs_embeds=None, cache_dtype: str = "float32") -> np.ndarray:
    """Logits [n, vocab] at every position of one prompt, in one prefill step."""
    return run_steps(model, [(input_ids, positions, inputs_embeds)], cache_dtype=cache_dtype)[0]
