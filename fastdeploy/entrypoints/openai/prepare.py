"""An OpenAI request (protocol.OpenAIRequest) -> the engine's prepared prompts, the way `LLM.chat` and
`LLM.generate` make them: one code path for the API server and run-batch.

Chat messages go through the LLM's chat template (its `tools` too, and the media parts fetched);
completion prompts are text (tokenized without special tokens) or token ids. Each prompt is then
validated by `LLMEngine.make_request` (prompt length, logprobs limits, the grammar compiled).
Embedding and score requests (protocol.PoolingRequest) are validated as `LLM.embed` and
`LLM.score` validate them (`prepare_pooling`). A request the model cannot answer (text from an
embedding model, embeddings from a generative one) is refused by `task_refusal`.
What the LLM cannot take is a ValueError naming the key: a per-request guided_decoding_backend
other than the LLM's, tool_choice "auto" without a tool-call parser, a constraint that does not
compile (named by the body key it came from).

Tool calls: with tools and tool_choice absent or "auto", the LLM's tool_call_parser reads the
calls; a forcing tool_choice's JSON is read back into calls (tool_parsers/tool_choice.py); every
other request keeps its text whole.
"""
from __future__ import annotations

from typing import Optional

from fastdeploy.engine.async_engine import UNSET
from fastdeploy.entrypoints.openai import constraints
from fastdeploy.entrypoints.openai.protocol import URLS
from fastdeploy.entrypoints.scoring import ScorePlan
from fastdeploy.tool_parsers import tool_choice as tool_choices


def task_refusal(llm, kind: str) -> Optional[str]:
    """Why `llm`'s model cannot answer a `kind` request ("chat", "completion", "embedding", "score"),
    or None when it can: text comes from generative models, embeddings from embedding models, scores
    from embedding models (cosine) and classification models (a one-label cross-encoder)."""
    task = llm.llm_engine.config.pooling_task
    served = _served_kinds(task)
    if kind in served:
        return None
    wanted = {"chat": "generate text", "completion": "generate text", "embedding": "serve embeddings",
              "score": "serve scores"}[kind]
    what = "a generative model" if task is None else f"a pooling model (task {task!r})"
    answers = f"it answers {', '.join(URLS[k] for k in served)}" if served else "no endpoint of this server serves it"
    return f"this model does not {wanted}: it is {what}; {answers}"


def _served_kinds(task: Optional[str]) -> list[str]:
    if task is None:
        return ["chat", "completion"]
    return [k for k, ok in (("embedding", task == "embed"), ("score", task in ("embed", "classify"))) if ok]


def refusal(llm, request) -> Optional[str]:
    """Why `llm` cannot take the request's output keys, or None when it can (callers check the request's
    kind first: `task_refusal`)."""
    config = llm.llm_engine.config
    wanted = request.guided_decoding_backend
    if wanted is not None and wanted != config.guided_decoding_backend:
        return (f"guided_decoding_backend={wanted!r}: per-request backends are not supported; this engine's backend "
                f"is {config.guided_decoding_backend!r} (--guided-decoding-backend): give that or leave the key out")
    if request.tool_choice == "auto" and not config.tool_call_parser:
        return "tool_choice='auto' needs a tool call parser: start with --tool-call-parser NAME"
    if request.constraint_key is not None:
        try:
            llm.llm_engine.structured_output.validate(request.sampling_params)
        except ValueError as e:
            return f"{request.constraint_key}: {e}"
    return None


def prompt_items(llm, request) -> list[tuple]:
    """(prompt text or None, token ids or None, images/videos or None) per prompt of the request."""
    if request.kind == "chat":
        return [llm._render_chat(request.messages, llm.chat_template, request.chat_template_kwargs, 0,
                                 request.tools)]
    return [llm._normalize_one(prompt, i) for i, prompt in enumerate(request.prompts)]


def make_requests(llm, request) -> list:
    """The request's prompts, validated and ready for `LLMEngine.enqueue` / `AsyncEngine.generate`.
    Raises ValueError/TypeError (bad input), FileNotFoundError/ConnectionError (a media URL)."""
    engine = llm.llm_engine
    return [engine.make_request(text, ids, request.sampling_params, i, mm)
            for i, (text, ids, mm) in enumerate(prompt_items(llm, request))]


def prepare(llm, request) -> list:
    """`make_requests` after `refusal` (its reason a ValueError)."""
    reason = refusal(llm, request)
    if reason is not None:
        raise ValueError(reason)
    return make_requests(llm, request)


def prepare_pooling(llm, request) -> tuple[list, Optional[ScorePlan]]:
    """A PoolingRequest's prompts, validated by the LLM's own path (`LLM.embed`'s, `LLM.score`'s),
    and for a score request the ScorePlan that reads the pairs' scores from their outputs (else None).
    ValueError/TypeError for what the LLM refuses (callers check the model's task first: `task_refusal`)."""
    if request.kind == "embedding":
        return llm._pooling_requests(request.prompts, request.pooling_params, "embed", "embed"), None
    plan = llm._score_plan(request.pairs, request.pooling_params, None)
    return plan.requests, plan


def tool_call_reader(request):
    """How the request's completions get their tool calls: UNSET (the LLM's parser reads them), None
    (no calls) or the forced call's reader (output processor's set_tool_call_reader)."""
    if constraints.parser_reads_calls(request.kind, request.tools, request.tool_choice):
        return UNSET
    return tool_choices.forced_call_reader(request.tool_choice) if tool_choices.forces_call(request.tool_choice) \
        else None
