"""Offline generation inside a Ray Data pipeline: `ds.map_batches(LLMPredictor, ...)`.

For users who already hold their data in a `ray.data.Dataset` (instead of an OpenAI batch file,
which `run_batch --data-parallel-size N` reads). Each Ray Data actor builds one LLM and completes
the batches it is given; Ray Data spreads the batches over `concurrency` such actors.

Example (a complete program)::

    import ray
    from fastdeploy.entrypoints.batch.ray_data import LLMPredictor

    ray.init(num_cpus=4)
    ds = ray.data.from_items([{"prompt": "The capital of France is"},
                              {"prompt": "Water boils at"}])
    out = ds.map_batches(
        LLMPredictor,
        fn_constructor_kwargs={
            "model": None,  # the default model; or a local directory / .gguf file
            "sampling_params": {"temperature": 0, "max_tokens": 32},
            "max_model_len": 2048,  # any other LLM(...) keyword
        },
        concurrency=2,  # two actors, one LLM each
        batch_size=64,  # rows handed to one __call__
        num_cpus=2,  # CPUs reserved per actor ...
        runtime_env={"env_vars": {"OMP_NUM_THREADS": "2"}},  # ... and the engine's threads
    )
    for row in out.take_all():
        print(row["prompt"], "->", row["generated_text"], row["num_generated_tokens"])

A chat dataset has a "messages" column instead, one conversation per row (a list of
{"role", "content"} dicts); "chat_template_kwargs" in fn_constructor_kwargs is passed to the
template, e.g. {"enable_thinking": False}.

Threads: fastdeploy reads OMP_NUM_THREADS when it is imported in the actor and gives the engine that
many threads (fastdeploy.platforms.cpu); set it with `runtime_env` as above so the actors on one
machine share its cores (Ray also sets it to the actor's num_cpus when left unset).
"""
from __future__ import annotations

from typing import Any, Optional, Union

import numpy as np

from fastdeploy.engine.sampling_params import SamplingParams
from fastdeploy.entrypoints.llm import LLM


class LLMPredictor:
    """A callable class for `Dataset.map_batches`: one LLM per Ray Data actor.

    model: the `LLM(model=...)` argument (None: the default model).
    sampling_params: a SamplingParams, or a dict of its keywords (Ray Data copies constructor
        arguments to the actors, so a plain dict is the portable form); None: SamplingParams().
    chat_template_kwargs: passed to the chat template for "messages" rows.
    engine_kwargs: every other `LLM(...)` keyword (max_model_len, max_num_seqs, ...).
    Raises what `LLM(...)` raises for bad settings, TypeError for a bad sampling_params.
    """

    def __init__(self, model: Optional[str] = None,
                 sampling_params: Union[SamplingParams, dict, None] = None,
                 chat_template_kwargs: Optional[dict] = None, **engine_kwargs: Any):
        if isinstance(sampling_params, dict):
            sampling_params = SamplingParams(**sampling_params)
        elif sampling_params is None:
            sampling_params = SamplingParams()
        elif not isinstance(sampling_params, SamplingParams):
            raise TypeError("sampling_params must be a SamplingParams or a dict, "
                            f"got {type(sampling_params).__name__}")
        self.sampling_params = sampling_params
        self.chat_template_kwargs = chat_template_kwargs
        self.llm = LLM(model=model, **engine_kwargs)

    def __call__(self, batch: dict) -> dict:
        """Complete one batch.

        batch: column name -> numpy array (Ray Data's default "numpy" format) or list, B rows.
            It needs a "messages" column (conversations; read first when both exist) or a
            "prompt" column (text).
        Returns the batch with two columns added: "generated_text" (object array of str, [B]) and
        "num_generated_tokens" (int64, [B]); the first completion of each row (n = 1).
        Raises KeyError when neither column exists, and what LLM.generate / LLM.chat raise for a
        bad row (the whole batch fails, as Ray Data expects of a map function).
        """
        if "messages" in batch:
            conversations = [_conversation(c) for c in batch["messages"]]
            outputs = self.llm.chat(conversations, self.sampling_params, use_tqdm=False,
                                    chat_template_kwargs=self.chat_template_kwargs)
        elif "prompt" in batch:
            outputs = self.llm.generate([str(p) for p in batch["prompt"]], self.sampling_params, use_tqdm=False)
        else:
            raise KeyError(f"LLMPredictor needs a 'prompt' or a 'messages' column, got {sorted(batch)}")
        result = dict(batch)
        result["generated_text"] = np.array([o.outputs.text for o in outputs], dtype=object)
        result["num_generated_tokens"] = np.array([len(o.outputs.token_ids) for o in outputs], dtype=np.int64)
        return result


def _conversation(value) -> list[dict]:
    """One "messages" cell as a list of plain message dicts.

    Ray Data stores a list-of-dicts column in Arrow (list of structs), which comes back as a numpy
    object array of dicts, with None for a key that another row's messages have and this one lacks:
    those None values are dropped.
    """
    return [{k: v for k, v in dict(m).items() if v is not None} for m in list(value)]
