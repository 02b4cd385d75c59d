"""Bench test fixtures: the fake OpenAI-compatible server from tests/fake_openai_server.py, on a free port."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from fake_openai_server import FakeState, fake_server_running


@pytest.fixture
def fake_server() -> Iterator[tuple[str, FakeState]]:
    """(base URL on a free port, the server's state); shut down after the test."""
    state = FakeState()
    with fake_server_running(state) as base_url:
        yield base_url, state
