"""Shared fixtures: the converted default model folder and transformers' reference runs on it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jido import LLM
from jido.models.loader import resolve_model

REFERENCE_PATH = Path(__file__).parent / "fixtures" / "gemma3_reference.json"


@pytest.fixture(scope="session")
def gemma_folder() -> Path:
    """The default Gemma 3 270M GGUF as an HF folder; converted once, then reused from ~/.cache/jido."""
    return resolve_model(None)


@pytest.fixture(scope="session")
def gemma_reference() -> dict:
    """transformers' ids and greedy runs on the same GGUF (made by fixtures/make_gemma3_reference.py)."""
    return json.loads(REFERENCE_PATH.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def llm() -> LLM:
    """The default model on CPU in float32, with a KV cache large enough for every test."""
    return LLM(kv_cache_memory="160MiB")
