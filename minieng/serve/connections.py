"""What the server does about a connection, before and beside its handlers: a body over the cap is
answered 413 before anything parses it (``BodyLimit``), and a client that disconnects cancels its
handler, whose clean-up aborts its requests (``cancel_on_disconnect``, vLLM's ``with_cancellation``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from minieng.serve.protocol import error_body


class BodyLimit:
    """ASGI middleware: reads a request's body whole, and answers 413 (OpenAI's error body) to one
    over ``max_bytes`` before anything parses or tokenizes it; the app then reads the body from
    memory.

    A body is over the cap by its ``Content-Length``, or (chunked) once the bytes received pass
    it; from then on its bytes are read and dropped, not kept, so that the client, which sends
    the whole body before it reads, gets the 413 rather than a reset connection.
    """

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        too_large = length.isdigit() and int(length) > self.max_bytes
        body, more = bytearray(), True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before it finished sending
            more = message.get("more_body", False)
            if not too_large:
                body += message.get("body", b"")
                too_large = len(body) > self.max_bytes
        if too_large:
            error = error_body(
                f"the request body is larger than this server's cap of {self.max_bytes} bytes: shorten the prompt", 413
            )
            return await JSONResponse(error, status_code=413)(scope, receive, send)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: the disconnect
            replayed = True
            return {"type": "http.request", "body": bytes(body), "more_body": False}

        await self.app(scope, replay, send)


async def cancel_on_disconnect(request: Request, handler: Awaitable):
    """Run ``handler`` until it returns or the client disconnects, whichever comes first (vLLM's
    ``with_cancellation``). A disconnect cancels the handler, whose ``CancelledError`` aborts its
    request; the answer is then an empty 499 ("client closed request"), which nobody reads.
    A streamed response returns at once, and its stream watches the connection itself."""
    work = asyncio.ensure_future(handler)
    watch = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            await asyncio.wait({work})  # let its clean-up (the abort) run
    if work.cancelled():
        return Response(status_code=499)
    return work.result()


async def disconnected(request: Request) -> None:
    """Return when the client disconnects (the ASGI server reports it through ``receive``)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
