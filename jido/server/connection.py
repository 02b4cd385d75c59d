"""HTTP connections: uvicorn's h11 protocol with a header read timeout and JSON errors for what it refuses."""
from __future__ import annotations

import asyncio
import http
import json

import h11
from starlette.types import Receive, Scope, Send
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from jido.server.errors import APIError, http_error

HEALTH_PATH = "/health"


class JidoH11Protocol(H11Protocol):
    """Uvicorn's h11 connection, changed in three ways, each answering with an OpenAI-style error body:

    - a request line and headers not complete ``header_read_timeout_s`` after the connection opened (or
      after the first byte of a following request arrived) get 408 and the connection closes; uvicorn
      has no such timeout, so a client trickling its headers held a connection forever;
    - past ``limit_concurrency`` open connections or requests in flight, a request gets 503 (uvicorn's
      own answer is plain text), except ``/health``: a load balancer must not mark a busy instance down;
    - a request h11 cannot parse gets 400 (uvicorn's is plain text too).
    """

    def __init__(self, config: Config, server_state: ServerState, app_state: dict,
                 header_read_timeout_s: float, _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.header_read_timeout_s = header_read_timeout_s
        self.header_timer: asyncio.TimerHandle | None = None
        self.head_bytes = 0
        # NOTE: uvicorn's own limit check is turned off; _admit applies the same limit with a JSON answer.
        self.max_concurrency, self.limit_concurrency = self.limit_concurrency, None
        self.inner_app = self.app
        if self.max_concurrency is not None:
            self.app = self._admit

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE:  # the head is not complete yet: the clock runs (or starts)
            self.head_bytes += len(data)
            self._arm_header_timer()
        else:
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.head_bytes = 0  # the next request's clock starts with its first byte (keep-alive covers idling)

    def send_400_response(self, msg: str) -> None:
        # uvicorn's msg is always "Invalid HTTP request received."; say what happens to the connection too.
        self._send_and_close(http_error(400, "the request is not valid HTTP/1.1; the connection is closed",
                                        "invalid_http"))

    def _arm_header_timer(self) -> None:
        if self.header_timer is None:
            self.header_timer = self.loop.call_later(self.header_read_timeout_s, self._header_timed_out)

    def _cancel_header_timer(self) -> None:
        if self.header_timer is not None:
            self.header_timer.cancel()
            self.header_timer = None

    def _header_timed_out(self) -> None:
        self.header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.head_bytes == 0:
            self.transport.close()  # a connection that never sent a byte: nothing to answer
            return
        self._send_and_close(APIError(408, f"request line and headers were not received within "
                                           f"{self.header_read_timeout_s:g} s", code="request_timeout"))

    def _send_and_close(self, error: APIError) -> None:
        """Write ``error`` as a whole response and close: the connection's state is past repair."""
        body = json.dumps(error.body()).encode()
        reason = http.HTTPStatus(error.status).phrase.encode()
        self.transport.write(b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
                             b"connection: close\r\n\r\n%s" % (error.status, reason, len(body), body))
        self.transport.close()

    async def _admit(self, scope: Scope, receive: Receive, send: Send) -> None:
        # As uvicorn counts: this connection is among the open ones, this request's task among the tasks.
        # /health answers from memory, so it costs the limit nothing to let it through.
        if scope.get("path") != HEALTH_PATH and (len(self.connections) >= self.max_concurrency
                                                 or len(self.tasks) > self.max_concurrency):
            error = http_error(503, f"the server has reached its limit of {self.max_concurrency} open "
                                    "connections or requests in flight; retry later", "too_many_connections")
            error.headers = {"Retry-After": "1", "Connection": "close"}
            await error.response()(scope, receive, send)
            return
        await self.inner_app(scope, receive, send)

