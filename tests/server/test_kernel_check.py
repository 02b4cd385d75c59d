"""`jido serve` stops at start when a C++ kernel library failed to build, unless told to serve on its fallback."""
from __future__ import annotations

import pytest

from jido.config import EngineConfig
from jido.server import launcher
from jido.server.config import ServerConfig
from jido.utils import cpp_build

FALLBACKS = {"jido_int8_dot": "the float kernels (RuntimeError: ninja: build stopped)"}


def test_check_kernels_names_each_library_its_reason_and_the_rebuild_command():
    with pytest.raises(launcher.KernelsMissingError) as raised:
        launcher.check_kernels(FALLBACKS, allowed=False)
    message = str(raised.value)
    assert "jido_int8_dot: the float kernels (RuntimeError: ninja: build stopped)" in message
    assert cpp_build.REBUILD_COMMAND in message and "--allow-kernel-fallbacks" in message
    launcher.check_kernels(FALLBACKS, allowed=True)
    launcher.check_kernels({}, allowed=False)


def test_serve_stops_before_listening_and_shuts_its_engine_down(tiny_model_folder, monkeypatch):
    monkeypatch.setattr(cpp_build, "fallbacks", lambda: dict(FALLBACKS))
    made = []
    real_engine = launcher.LLMEngine

    def engine(config):
        made.append(real_engine(config))
        return made[-1]

    monkeypatch.setattr(launcher, "LLMEngine", engine)
    monkeypatch.setattr(launcher, "bind_socket", lambda *a: pytest.fail("the server must not listen"))
    config = EngineConfig.from_kwargs(model=str(tiny_model_folder), kv_cache_memory="1MiB", block_size=4,
                                      distributed_executor_backend="uni")
    with pytest.raises(launcher.KernelsMissingError, match="jido_int8_dot"):
        launcher.serve(config, ServerConfig(port=0))
    assert made and made[0].core.executor.worker.closed


def test_the_cli_exits_1_with_the_reason_at_error_level(tiny_model_folder, monkeypatch, caplog):
    from jido.cli import main

    monkeypatch.setattr(cpp_build, "fallbacks", lambda: dict(FALLBACKS))
    rc = main(["serve", "--model", str(tiny_model_folder), "--kv-cache-memory", "1MiB", "--block-size", "4",
               "--distributed-executor-backend", "uni", "--port", "0"])
    assert rc == 1
    assert any(r.levelname == "ERROR" and "jido_int8_dot" in r.getMessage() for r in caplog.records)
