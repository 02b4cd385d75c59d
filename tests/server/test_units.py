"""The server's pieces without a model: stream holdback, config validation (metrics: test_metrics.py)."""
from __future__ import annotations

import logging

import pytest
from server_harness import self_signed_cert

from jido.engine.outputs import CompletionOutput
from jido.server.config import ServerConfig
from jido.server.responses import StreamCursor


def _completion(text: str, num_tokens: int, finish_reason: str | None = None) -> CompletionOutput:
    return CompletionOutput(0, text, list(range(num_tokens)), None, None, finish_reason)


def test_stream_cursor_holds_back_text_that_may_begin_a_stop_string():
    cursor = StreamCursor(holdback=len("STOP") - 1)
    assert cursor.advance(_completion("Hello ST", 2)) == ("Hello", slice(0, 2))
    assert cursor.advance(_completion("Hello STA", 3)) == (" ", slice(2, 3))
    assert cursor.advance(_completion("Hello STAR", 4, "stop")) == ("STAR", slice(3, 4))
    assert cursor.advance(_completion("Hello STAR", 4, "stop")) is None


def test_stream_cursor_sends_tokens_that_added_no_text_with_the_next_delta():
    cursor = StreamCursor(holdback=0)
    assert cursor.advance(_completion("ab", 1)) == ("ab", slice(0, 1))
    assert cursor.advance(_completion("ab", 2)) is None  # half of a multi-byte character
    assert cursor.advance(_completion("abé", 3)) == ("é", slice(1, 3))


@pytest.mark.parametrize("kwargs, words", [({"port": 70000}, "port must be"), ({"api_key": ""}, "api_key"),
                                           ({"max_waiting_requests": 0}, "max_waiting_requests"),
                                           ({"drain_timeout_s": -1}, "drain_timeout_s"),
                                           ({"limit_concurrency": 0}, "limit_concurrency must be a positive"),
                                           ({"request_read_timeout_s": 0}, "request_read_timeout_s must be .* > 0"),
                                           ({"header_read_timeout_s": -1}, "header_read_timeout_s must be .* > 0"),
                                           ({"timeout_keep_alive_s": float("inf")}, "timeout_keep_alive_s")])
def test_server_config_rejects_bad_values(kwargs, words):
    with pytest.raises(ValueError, match=words):
        ServerConfig(**kwargs)


def test_api_key_comes_from_jido_api_key_when_not_given(monkeypatch):
    monkeypatch.setenv("JIDO_API_KEY", "from-env")
    assert ServerConfig().api_key == "from-env"
    assert ServerConfig(api_key="from-flag").api_key == "from-flag"
    assert ServerConfig(api_key=None).api_key is None
    assert "from-env" not in repr(ServerConfig())
    monkeypatch.setenv("JIDO_API_KEY", "")
    assert ServerConfig().api_key is None
    monkeypatch.delenv("JIDO_API_KEY")
    assert ServerConfig().api_key is None


def test_server_config_takes_a_matching_tls_key_and_certificate(tmp_path):
    key, cert = self_signed_cert(tmp_path)
    assert ServerConfig(ssl_keyfile=key, ssl_certfile=cert).scheme == "https"
    assert ServerConfig().scheme == "http"


def test_server_config_rejects_incomplete_missing_or_unloadable_tls_files(tmp_path):
    key, cert = self_signed_cert(tmp_path)
    with pytest.raises(ValueError, match="^ssl_keyfile and ssl_certfile go together: give both to serve HTTPS"):
        ServerConfig(ssl_certfile=cert)
    with pytest.raises(ValueError, match=f"^ssl_keyfile: no such file: {tmp_path}/missing.pem$"):
        ServerConfig(ssl_keyfile=str(tmp_path / "missing.pem"), ssl_certfile=cert)
    with pytest.raises(ValueError, match="are not a PEM certificate and its unencrypted private key"):
        ServerConfig(ssl_keyfile=cert, ssl_certfile=cert)


def test_served_model_name_defaults_to_the_model_name(tmp_path):
    assert ServerConfig().model_name(None) == "gemma-3-270m"
    assert ServerConfig().model_name("qwen2.5-coder-1.5b-instruct") == "qwen2.5-coder-1.5b-instruct"
    assert ServerConfig().model_name(str(tmp_path / "qwen3-0.6b-q8_0.gguf")) == "qwen3-0.6b-q8_0"
    assert ServerConfig().model_name(str(tmp_path)) == tmp_path.name
    assert ServerConfig(served_model_name="mine").model_name(None) == "mine"


@pytest.mark.parametrize("chat, path, field", [(True, "/v1/chat/completions", '"messages"'),
                                               (False, "/v1/completions", '"prompt"')])
def test_the_curl_line_chats_only_with_a_model_that_has_a_chat_template(caplog, chat, path, field):
    from jido.server.launcher import _log_usage

    with caplog.at_level(logging.INFO, logger="jido"):
        _log_usage(ServerConfig(), "127.0.0.1", 8000, "gemma-3-270m", chat=chat)
    curl = caplog.messages[-1]
    assert curl.startswith(f"try: curl http://127.0.0.1:8000{path} ") and field in curl
