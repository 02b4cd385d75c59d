"""Engine fixtures: one real Gemma 3 270M engine per configuration, shared by the tests of a session."""
from __future__ import annotations

import pytest

from jido import LLM


@pytest.fixture(scope="session")
def llm() -> LLM:
    """The default model on CPU in float32, with a KV cache large enough for every test."""
    return LLM(kv_cache_memory="160MiB")
