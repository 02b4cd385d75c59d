"""The KV endpoint: each instance's ZMQ server for its peers' KV requests, and the client it sends its own with.

A message is a JSON header frame (``{"op": ..., "id": ...}``) followed by payload frames (what the transport
carries inline). The server (a ROUTER socket on its own thread) hands every request to a handler, which
answers at once or asks to be called again later (:data:`PARK`: a pull for KV whose prefill is still being
registered); the client (one DEALER socket per peer, used from one thread) sends a request and waits for
the reply with the same ``id``, dropping late replies to requests it gave up on.
"""
from __future__ import annotations

import itertools
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from jido.kvtransfer.transport import TransferError

logger = logging.getLogger("jido")
PARK = object()  # a handler's answer: not yet, call me again with the same request
POLL_S = 0.02  # the server's poll: how often parked requests and leases are looked at
Reply = tuple[dict[str, Any], list[Any]]
Handler = Callable[[dict[str, Any], list[memoryview]], "Reply | object"]


def _encode(header: dict[str, Any]) -> bytes:
    return json.dumps(header, separators=(",", ":")).encode()


def _decode(frame: Any) -> dict[str, Any]:
    header = json.loads(bytes(frame))
    if not isinstance(header, dict):
        raise ValueError("a KV message header must be a JSON object")
    return header


class KVServer:
    """Answers peers' KV requests on ``tcp://ip:port`` (port 0: a free one) with ``handler`` on one thread.

    ``on_poll`` runs on that thread between messages (lease checks). The handler runs on it too, so it
    must not block for long: it answers from memory or parks the request.
    """

    def __init__(self, ip: str, port: int, handler: Handler, on_poll: Callable[[], None]) -> None:
        self._handler = handler
        self._on_poll = on_poll
        self._socket = zmq.Context.instance().socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            if port == 0:
                port = self._socket.bind_to_random_port(f"tcp://{ip}")
            else:
                self._socket.bind(f"tcp://{ip}:{port}")
        except zmq.ZMQError as exc:
            self._socket.close()
            raise ValueError(f"kv_transfer_config: cannot listen for KV on {ip}:{port}: {exc}") from None
        self.address = f"tcp://{ip}:{port}"
        self._parked: list[tuple[bytes, dict[str, Any], list[memoryview]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jido-kv-endpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if poller.poll(POLL_S * 1000):
                while self._socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                    identity, *frames = self._socket.recv_multipart(copy=False)
                    self._serve(identity.bytes, frames)
            for identity, header, payloads in self._take_parked():
                self._answer(identity, header, payloads)
            self._on_poll()
        self._socket.close()

    def _take_parked(self) -> list[tuple[bytes, dict[str, Any], list[memoryview]]]:
        parked, self._parked = self._parked, []
        return parked

    def _serve(self, identity: bytes, frames: list[zmq.Frame]) -> None:
        try:
            header = _decode(frames[0].buffer)
        except (ValueError, IndexError) as exc:
            self._send(identity, {"ok": False, "error": f"malformed KV message: {exc}"}, [])
            return
        self._answer(identity, header, [f.buffer for f in frames[1:]])

    def _answer(self, identity: bytes, header: dict[str, Any], payloads: list[memoryview]) -> None:
        try:
            reply = self._handler(header, payloads)
        except Exception as exc:  # noqa: BLE001 - a bad request must not stop the endpoint serving others
            logger.exception("KV endpoint: request %s failed", header.get("op"))
            reply = ({"ok": False, "error": f"{type(exc).__name__}: {exc}"}, [])
        if reply is PARK:
            self._parked.append((identity, header, payloads))
            return
        answer, frames = reply
        self._send(identity, {**answer, "id": header.get("id")}, frames)

    def _send(self, identity: bytes, header: dict[str, Any], frames: list[Any]) -> None:
        try:
            self._socket.send_multipart([identity, _encode(header), *frames], copy=False)
        except zmq.ZMQError as exc:
            logger.warning("KV endpoint: reply to a peer failed: %s", exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)


class KVClient:
    """Sends requests to peers' KV endpoints and waits for their replies; use it from one thread only."""

    def __init__(self) -> None:
        self._sockets: dict[str, zmq.Socket] = {}
        self._ids = itertools.count()

    def request(self, address: str, header: dict[str, Any], frames: list[Any] | None = None,
                timeout_s: float = 10.0) -> tuple[dict[str, Any], list[memoryview]]:
        """Send ``header`` (and ``frames``) to ``address``; returns the reply's header and payload buffers.

        Raises:
            TransferError: no reply within ``timeout_s`` (the peer is dead, stalled or unreachable), or the
                peer answered ``ok: false`` (its error is the message).
        """
        socket = self._socket(address)
        request_id = next(self._ids)
        socket.send_multipart([_encode({**header, "id": request_id}), *(frames or [])], copy=False)
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not socket.poll(left * 1000):
                self._drop(address)  # a reply may still come: a fresh socket never sees it
                raise TransferError(f"no answer from the KV endpoint {address} within {timeout_s:g} s "
                                    f"({header.get('op')})")
            reply, *payload = socket.recv_multipart(copy=False)
            answer = _decode(reply.buffer)
            if answer.get("id") != request_id:
                continue  # a late reply to a request given up on
            if not answer.get("ok"):
                raise TransferError(str(answer.get("error", "the peer refused the request")))
            return answer, [f.buffer for f in payload]

    def _socket(self, address: str) -> zmq.Socket:
        if address not in self._sockets:
            socket = zmq.Context.instance().socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(address)
            self._sockets[address] = socket
        return self._sockets[address]

    def _drop(self, address: str) -> None:
        socket = self._sockets.pop(address, None)
        if socket is not None:
            socket.close()

    def close(self) -> None:
        for address in list(self._sockets):
            self._drop(address)
