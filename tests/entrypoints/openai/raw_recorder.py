"""An httpx transport that keeps each response's raw bytes, for tests that must see what the
official `openai` client hides (its streams stop at `data: [DONE]` without saying whether it came).

    bodies = {}
    http = httpx.AsyncClient(transport=Recorder(bodies))
    client = server.async_client(http_client=http)
    await client.completions.create(..., extra_headers={"x-job": "a"})   # bodies["a"]: the raw bytes
"""
import httpx


class Recorder(httpx.AsyncBaseTransport):
    """An HTTP transport that keeps each response's raw bytes in `bodies`, by the request's x-job header."""

    def __init__(self, bodies: dict):
        self.inner = httpx.AsyncHTTPTransport()
        self.bodies = bodies

    async def handle_async_request(self, request):
        response = await self.inner.handle_async_request(request)
        body = self.bodies.setdefault(request.headers["x-job"], bytearray())
        return httpx.Response(response.status_code, headers=response.headers, extensions=response.extensions,
                              stream=_Tee(response.stream, body))

    async def aclose(self):
        await self.inner.aclose()


class _Tee(httpx.AsyncByteStream):
    def __init__(self, inner, sink: bytearray):
        self.inner, self.sink = inner, sink

    async def __aiter__(self):
        async for chunk in self.inner:
            self.sink += chunk
            yield chunk

    async def aclose(self):
        await self.inner.aclose()


def sse_events(raw: bytes) -> list[str]:
    """The `data: ...` events of a raw SSE body, in order."""
    return [e for e in raw.decode().split("\n\n") if e]
