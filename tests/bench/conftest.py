"""Bench test fixtures: the fake OpenAI-compatible server from fake_openai_server.py, on a free port."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer

import pytest
from fake_openai_server import FakeState, make_handler


@pytest.fixture
def fake_server() -> Iterator[tuple[str, FakeState]]:
    """(base URL on a free port, the server's state); shut down after the test."""
    state = FakeState()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
