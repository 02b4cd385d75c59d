"""An engine's memory goes when it is shut down or dropped, not when the process ends: one process may make many
engines (a notebook, this suite, a server's tests) and must not keep each one resident."""
from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest

from jido.config import EngineConfig
from jido.engine.llm_engine import LLMEngine
from jido.server.app import create_app
from jido.server.config import ServerConfig
from jido.utils import malloc_policy


def _engine(folder: Path) -> LLMEngine:
    return LLMEngine(EngineConfig.from_kwargs(model=str(folder), dtype="float32", kv_cache_memory="1MiB",
                                              block_size=4))


def _model_and_kv(engine: LLMEngine) -> list[weakref.ref]:
    runner = engine.core.executor.worker.runner
    return [weakref.ref(runner.model), *(weakref.ref(t) for t in runner.kv_caches if t is not None)]


def test_shutdown_frees_the_model_and_kv_cache_while_the_engine_is_still_held(tiny_model_folder):
    engine = _engine(tiny_model_folder)
    held = _model_and_kv(engine)
    engine.shutdown()
    assert all(ref() is None for ref in held)
    engine.shutdown()  # a second shutdown is a no-op


@pytest.fixture
def thresholds(monkeypatch) -> list[int]:
    """The allocator thresholds engines set, in order; the engines this test makes are the only holders."""
    calls: list[int] = []
    monkeypatch.setattr(malloc_policy, "_holders", 0)  # the session's engines hold it outside this test
    monkeypatch.setattr(malloc_policy, "_set_thresholds", lambda limit: calls.append(limit) or True)
    return calls


def test_an_engine_dropped_without_shutdown_frees_its_model_and_the_policy_when_collected(tiny_model_folder,
                                                                                          thresholds):
    engine = _engine(tiny_model_folder)
    held = _model_and_kv(engine)
    del engine
    gc.collect()
    assert all(ref() is None for ref in held)
    assert thresholds == [malloc_policy.KEEP_BYTES, malloc_policy.GLIBC_DEFAULT_BYTES]


def test_an_apps_engine_is_not_kept_alive_once_the_app_is_dropped(tiny_model_folder):
    engine = _engine(tiny_model_folder)
    app = create_app(engine, ServerConfig())
    engine_ref = weakref.ref(engine)
    del app, engine
    gc.collect()
    assert engine_ref() is None


def test_the_allocator_policy_is_released_by_the_last_engine_that_holds_it(tiny_model_folder, thresholds):
    first, second = _engine(tiny_model_folder), _engine(tiny_model_folder)
    assert thresholds == [malloc_policy.KEEP_BYTES] * 2
    first.shutdown()
    assert thresholds == [malloc_policy.KEEP_BYTES] * 2  # the second engine still serves under the policy
    second.shutdown()
    assert thresholds[-1] == malloc_policy.GLIBC_DEFAULT_BYTES


def test_an_engine_that_never_took_the_policy_does_not_release_anothers(tiny_model_folder, thresholds, monkeypatch):
    holder = _engine(tiny_model_folder)
    monkeypatch.setattr(malloc_policy, "_set_thresholds", lambda limit: False)  # as where mallopt refuses
    other = _engine(tiny_model_folder)
    other.shutdown()
    assert malloc_policy._holders == 1  # the holder's policy still stands
    monkeypatch.setattr(malloc_policy, "_set_thresholds", lambda limit: thresholds.append(limit) or True)
    holder.shutdown()
    assert malloc_policy._holders == 0 and thresholds[-1] == malloc_policy.GLIBC_DEFAULT_BYTES
