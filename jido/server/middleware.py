"""ASGI guards in front of every route: the API key, the request body size limit and its read timeout."""
from __future__ import annotations

import asyncio
import hmac
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from jido.server.errors import APIError, http_error

_OPEN_PATHS = ("/health",)


class GuardMiddleware:
    """Refuses a request before the app parses it: a wrong or missing API key (401, nothing about the
    model), a body over ``max_body_bytes`` (413, from Content-Length or while the body streams in), or a
    body not fully received within ``read_timeout_s`` of the headers (408, and the connection closes).
    """

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int, read_timeout_s: float) -> None:
        self.app = app
        # NOTE: bytes, because a header arrives as bytes: a non-ASCII key matches the UTF-8 a client sends.
        self.api_key = None if api_key is None else api_key.encode("utf-8")
        self.max_body_bytes = max_body_bytes
        self.read_timeout_s = read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        error = self._check_headers(scope)
        if error is not None:
            await error.response()(scope, receive, send)
            return
        await self.app(scope, self._limited(receive), send)

    def _check_headers(self, scope: Scope) -> APIError | None:
        headers = dict(scope["headers"])
        if self.api_key is not None and scope["path"] not in _OPEN_PATHS:
            if not _bearer_matches(headers.get(b"authorization", b""), self.api_key):
                return APIError(401, "missing or invalid API key: send 'Authorization: Bearer <key>'",
                                "authentication_error", code="invalid_api_key",
                                headers={"WWW-Authenticate": "Bearer"})
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> APIError:
        return http_error(413, f"request body is larger than the limit of {self.max_body_bytes} bytes",
                          "request_too_large")

    def _too_slow(self) -> APIError:
        # Connection: close, as the rest of the body may still be on its way: the connection cannot be reused.
        return APIError(408, f"request body was not received within {self.read_timeout_s:g} s",
                        code="request_timeout", headers={"Connection": "close"})

    def _limited(self, receive: Receive) -> Receive:
        """``receive`` that raises an APIError (rendered by the app): 413 once the body passes the limit,
        408 when the whole body has not arrived by the deadline. After the body it waits without a deadline
        (the next message is the client hanging up, whenever it does).
        """
        received = 0
        deadline = time.monotonic() + self.read_timeout_s
        body_done = False

        async def limited_receive() -> Message:
            nonlocal received, body_done
            if body_done:
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise self._too_slow() from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise self._too_large()
                body_done = not message.get("more_body", False)
            return message

        return limited_receive


def _bearer_matches(authorization: bytes, api_key: bytes) -> bool:
    """``Bearer <key>`` with the scheme in any case (RFC 7235), the key compared in constant time."""
    scheme, _, credentials = authorization.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(credentials.lstrip(b" "), api_key)
