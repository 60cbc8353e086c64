"""Decoder pooling models from FastDeploy's Paddle layout (`-Paddle` repos) give what the HF layout gives, and
both what transformers' base model gives (the last token's hidden state, normalised)."""
import numpy as np
import pytest
import torch

from fastdeploy import LLM
from test_paddle_layout import make_hf_checkpoint, to_paddle_layout

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Hello world!", "def f(x): return x + 1"]


@pytest.mark.parametrize("name", ["qwen3", "ernie45"])
def test_paddle_layout_embeddings_equal_the_hf_layout_and_transformers(tmp_path, name):
    from transformers import AutoTokenizer

    hf = make_hf_checkpoint(tmp_path / "hf", name)
    paddle_dir = to_paddle_layout(tmp_path / "hf", tmp_path / "paddle", name)
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "hf"))
    ours = {layout: LLM(str(tmp_path / layout), convert="embed", dtype="float32", max_model_len=128)
            .embed(TEXTS, use_tqdm=False) for layout in ("hf", "paddle")}
    assert paddle_dir.exists()
    for i, text in enumerate(TEXTS):
        with torch.no_grad():
            last = hf.model(torch.tensor([tok(text)["input_ids"]])).last_hidden_state[0, -1].numpy()
        ref = last / np.linalg.norm(last)
        for layout in ("hf", "paddle"):
            np.testing.assert_allclose(ours[layout][i].outputs.data, ref, rtol=1e-4, atol=1e-5)
