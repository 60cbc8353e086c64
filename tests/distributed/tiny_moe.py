"""Tiny random MoE checkpoints whose shapes split over 2 and 3 ranks (written by transformers).

6 query / 3 KV heads of 16 dims, hidden 64, intermediate 96, experts' intermediate 48 (all
divisible by 2 and 3), 4 experts top-2, vocab 512 (not divisible by 3: the last rank's vocabulary
rows are padded). The first layer is dense, the next two sparse; ERNIE gets a shared expert and a
non-zero routing correction bias. `sizes` overrides COMMON's (wint4 on 2 ranks needs intermediate
sizes whose halves are multiples of its 32-input groups).
"""
from pathlib import Path

from tiny_llama import VOCAB_SIZE, write_tokenizer

COMMON = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=96, moe_intermediate_size=48,
              num_hidden_layers=3, num_attention_heads=6, num_key_value_heads=3, head_dim=16,
              max_position_embeddings=512, initializer_range=0.2, bos_token_id=1, eos_token_id=2, pad_token_id=2)


def make_tiny_moe(path: Path, family: str, seed: int = 0, **sizes) -> Path:
    """Save a random 3-layer `family` ("qwen3_moe" or "ernie4_5_moe") model at `path`; returns path."""
    import torch

    torch.manual_seed(seed)
    common = {**COMMON, **sizes}
    if family == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**common, num_experts=4, num_experts_per_tok=2,
                                                   norm_topk_prob=True, mlp_only_layers=[0], rms_norm_eps=1e-6,
                                                   tie_word_embeddings=False))
    else:
        from transformers import Ernie4_5_MoeConfig, Ernie4_5_MoeForCausalLM

        model = Ernie4_5_MoeForCausalLM(Ernie4_5_MoeConfig(**common, moe_num_experts=4, moe_k=2,
                                                           moe_layer_start_index=1, moe_num_shared_experts=1,
                                                           rms_norm_eps=1e-5, use_bias=False,
                                                           tie_word_embeddings=True))
        with torch.no_grad():
            for layer in model.model.layers:
                if hasattr(layer.mlp, "gate"):
                    layer.mlp.gate.moe_statics.e_score_correction_bias.normal_(0, 0.1)
    model.eval().save_pretrained(str(path))
    write_tokenizer(path)
    return path
