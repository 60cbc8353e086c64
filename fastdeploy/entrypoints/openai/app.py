"""The FastAPI application of the API server: routes, API keys, the concurrency limit, draining.

Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, POST /v1/score,
GET /v1/models, GET /health (200; 503 once the engine is dead or the server is draining), GET
/version, GET /metrics (Prometheus text, unless the metrics have their own port). A generative
model answers the completion routes, an embedding model /v1/embeddings and /v1/score, a one-label
classification model (a cross-encoder) /v1/score; any other route of the four is a 400 saying why.

Every error is OpenAI's body `{"error": {"message", "type", "param", "code"}}`:
- 400: a body that is not a JSON object, or anything the offline API rejects (protocol.py and the
  engine's own validation, prepare.py); never FastAPI's 422;
- 401: `/v1/*` without `Authorization: Bearer <key>` matching one of the API keys (when set);
- 404: an unknown route, or a `model` that is not served;
- 429: more than `max_concurrency` requests at once (completions, embeddings, scores);
- 500: a request that failed while running; 503: the engine is dead or the server is draining.

Non-streamed requests race the client: when the client disconnects, the handler is cancelled and
the engine requests are aborted. Streamed ones are cancelled by Starlette when the client goes.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Optional

from fastapi import FastAPI, Request

import fastdeploy
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fastdeploy.entrypoints.openai import protocol
from fastdeploy.entrypoints.openai.metrics import CONTENT_TYPE
from fastdeploy.entrypoints.openai.protocol import OpenAIError
from fastdeploy.entrypoints.openai.serving import OpenAIServing


@dataclass
class ServerState:
    """What the routes share. `in_flight`: completion requests being answered (streams until their
    last event); `draining`: a shutdown signal came, new requests get 503."""

    serving: OpenAIServing
    served_model_names: list[str]
    model_path: str
    max_model_len: int
    api_keys: list[str] = field(default_factory=list)
    max_concurrency: int = 2048
    metrics_on_api_port: bool = True
    in_flight: int = 0
    draining: bool = False
    created: int = field(default_factory=lambda: int(time.time()))


def error_response(error: OpenAIError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status_code)


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="fastdeploy OpenAI-compatible server", version=fastdeploy.__version__, docs_url=None, redoc_url=None)
    app.state.server = state

    @app.exception_handler(OpenAIError)
    async def openai_error(_request: Request, error: OpenAIError):
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, error: StarletteHTTPException):
        kind = "not_found_error" if error.status_code == 404 else "invalid_request_error"
        return error_response(OpenAIError(error.status_code, str(error.detail), type=kind))

    @app.middleware("http")
    async def gatekeeper(request: Request, call_next):
        if request.url.path.startswith("/v1"):
            if state.api_keys and request.headers.get("authorization", "") not in {f"Bearer {k}" for k in
                                                                                     state.api_keys}:
                return error_response(OpenAIError(401, "Unauthorized: give a valid API key as 'Authorization: "
                                                       "Bearer <key>'", type="authentication_error",
                                                  code="invalid_api_key"))
            if state.draining:
                return _unavailable("the server is shutting down")
        return await call_next(request)

    @app.get("/health")
    async def health():
        engine = state.serving.engine
        if engine.dead is not None:
            return _unavailable(f"the engine stopped: {type(engine.dead).__name__}: {engine.dead}")
        if state.draining:
            return _unavailable("the server is shutting down")
        return Response(status_code=200)

    @app.get("/version")
    async def version():
        return {"version": fastdeploy.__version__}

    @app.get("/v1/models")
    async def models():
        data = [{"id": name, "object": "model", "created": state.created, "owned_by": "fastdeploy",
                 "root": state.model_path, "parent": None, "max_model_len": state.max_model_len}
                for name in state.served_model_names]
        return {"object": "list", "data": data}

    if state.metrics_on_api_port:
        @app.get("/metrics")
        async def metrics():
            return Response(state.serving.metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _complete(state, request, protocol.parse_chat_request)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _complete(state, request, protocol.parse_completion_request)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        return await _pool(state, request, protocol.parse_embedding_request)

    @app.post("/v1/score")
    async def score(request: Request):
        return await _pool(state, request, protocol.parse_score_request)

    return app


def _unavailable(message: str) -> JSONResponse:
    return error_response(OpenAIError(503, message, type="service_unavailable", code="service_unavailable"))


def _admit(state: ServerState) -> None:
    """Count one more request in flight; OpenAIError 429 beyond max_concurrency."""
    if state.in_flight >= state.max_concurrency:
        raise OpenAIError(429, f"too many requests: this server answers at most {state.max_concurrency} at once "
                               "(--max-concurrency); retry later", type="rate_limit_error", code="rate_limit_exceeded")
    state.in_flight += 1


async def _pool(state: ServerState, request: Request, parse):
    """An embedding or score request: parsed, prepared off the event loop, pooled, answered whole."""
    _admit(state)
    try:
        parsed = parse(await _json_body(request), state.served_model_names)
        serving = state.serving
        if serving.engine.dead is not None:
            return _unavailable(f"the engine stopped: {serving.engine.dead}")
        prepared = await serving.prepare_pooling(parsed)
        body = await _unless_disconnected(request, serving.pool(parsed, prepared))
        return JSONResponse(body) if body is not None else Response(status_code=499)
    finally:
        state.in_flight -= 1


async def _complete(state: ServerState, request: Request, parse):
    _admit(state)
    streaming = False
    try:
        parsed = parse(await _json_body(request), state.served_model_names)
        serving = state.serving
        if serving.engine.dead is not None:
            return _unavailable(f"the engine stopped: {serving.engine.dead}")
        prepared = await serving.prepare(parsed)
        if parsed.stream:
            streaming = True
            return _CountedStream(state, serving.stream(parsed, prepared))
        body = await _unless_disconnected(request, serving.complete(parsed, prepared))
        return JSONResponse(body) if body is not None else Response(status_code=499)
    finally:
        if not streaming:
            state.in_flight -= 1


class _CountedStream(StreamingResponse):
    """An SSE response that holds its place in `in_flight` until it has been sent, or the client has
    left (also when that happens before its first event)."""

    def __init__(self, state: ServerState, events):
        super().__init__(events, media_type="text/event-stream")
        self.state = state

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.state.in_flight -= 1


async def _json_body(request: Request) -> dict:
    raw = await request.body()
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise OpenAIError(400, f"the request body is not valid JSON: {e}", code="invalid_json") from e
    if not isinstance(body, dict):
        raise OpenAIError(400, f"the request body must be a JSON object, got {type(body).__name__}",
                          code="invalid_request")
    return body


async def _unless_disconnected(request: Request, work) -> Optional[dict]:
    """`work`'s result, or None when the client disconnected first (then `work` is cancelled, which
    aborts its engine requests)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        return None
    finally:
        gone.cancel()
        if not task.done():
            task.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
