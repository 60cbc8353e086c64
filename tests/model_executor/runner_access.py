"""The one place the model tests reach into an LLM's model runner (its model and KV caches)."""


def model_runner(llm):
    """The model runner of an LLM (owner of `.model` and `.kv_caches`): the one place tests reach it."""
    return llm.llm_engine.executor.runner


def forward_logits(llm, prompts: list[list[int]], block_tables: list[list[int]], history: int):
    """Logits [total tokens, vocab] of every token of `prompts` in one ragged step, each prompt after
    its own `history` tokens already in its cache blocks `block_tables` (the runner's model and caches)."""
    import numpy as np
    import paddle

    from fastdeploy.model_executor.forward_meta import ForwardMeta

    runner = model_runner(llm)
    meta = ForwardMeta.build(seq_lens_this_time=[len(p) for p in prompts], seq_lens_decoder=[history] * len(prompts),
                             block_tables=block_tables, block_size=runner.block_size, caches=runner.kv_caches)
    ids = paddle.to_tensor(np.asarray([t for p in prompts for t in p], dtype=np.int64))
    positions = paddle.to_tensor(np.concatenate([np.arange(history, history + len(p)) for p in prompts]))
    with paddle.no_grad():
        hidden = runner.model(ids, positions, meta)
        return runner.model.compute_logits(hidden).numpy()
