"""benchmarks/soak.py's traffic for a few seconds against a tiny model: nothing lost, the server idle after."""
from __future__ import annotations

import asyncio

import pytest
from benchmark_scripts import load_benchmark
from server_harness import GEMMA_CHAT_TEMPLATE, running_server
from tiny_gemma import make_tiny_model

from jido.server.config import ServerConfig



@pytest.fixture(scope="module")
def soak():
    return load_benchmark("soak")


def test_a_short_soak_loses_nothing_and_leaves_the_server_idle(soak, tmp_path):
    model = str(make_tiny_model(tmp_path / "tiny-gemma3"))
    # max_model_len 512: the soak's longest good request fits, its too-long prompts do not (in tokens or bytes).
    config = ServerConfig(max_request_body_bytes=soak.BODY_LIMIT, chat_template=GEMMA_CHAT_TEMPLATE)
    with running_server(config, model=model, max_model_len=512, max_num_seqs=4) as server:
        result = asyncio.run(soak.soak(server.base_url, duration_s=4, concurrency=4, bad_fraction=0.4))
    assert (result.lost, result.unexpected, result.failures) == (0, 0, [])
    assert result.gauges == {name: 0.0 for name in soak.GAUGES}
    assert result.succeeded > 0 and sum(result.rejected.values()) > 0
    assert result.sent == result.succeeded + result.disconnected + sum(result.rejected.values())


@pytest.mark.parametrize("events, lost", [([b'{"choices": [{"finish_reason": "stop"}]}', b"[DONE]"], 0),
                                          ([b'{"choices": [{"finish_reason": null}]}'], 1),
                                          ([b'{"choices": [{"finish_reason": "stop"}]}', b"{not json", b"[DONE]"], 1),
                                          ([], 1)])
def test_a_stream_without_a_finish_and_done_counts_as_lost(soak, events, lost):
    result = soak.SoakResult()
    soak._judge_stream(result, events, "completion_stream")
    assert (result.lost, result.succeeded) == (lost, 1 - lost)


@pytest.mark.parametrize("status, raw, expected, lost, unexpected", [
    (400, b'{"error": {"message": "m", "type": "t", "param": "p", "code": null}}', 400, 0, 0),
    (400, b'{"error": {"message": "m", "type": "t", "param": "p", "code": null}}', 200, 0, 1),
    (413, b"Request Entity Too Large", 413, 1, 0),
    (500, b'{"error": {"message": "m", "type": "t", "param": null, "code": null}}', 200, 1, 0),
    (503, b'{"error": {"message": "m", "type": "t", "param": null, "code": null}}', 200, 1, 0)])
def test_5xx_and_error_bodies_that_are_not_openai_ones_count_as_lost(soak, status, raw, expected, lost, unexpected):
    result = soak.SoakResult()
    soak._judge_status(result, status, raw, expected, "kind")
    assert (result.lost, result.unexpected, result.rejected) == (lost, unexpected, {str(status): 1})
