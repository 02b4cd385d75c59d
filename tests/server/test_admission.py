"""Admission of a batch of prompts: one the server could never hold is a 400 naming the field to change (a
retryable 503 would be retried forever); one that fits is taken whole, even when it fills every slot."""
from __future__ import annotations

import json

import pytest
from server_harness import metric, running_server
from tiny_model_folder import BOS_ID

from jido.server.config import ServerConfig

# 8 running slots and 4 waiting ones: at most 12 sequences at once.
MAX_NUM_SEQS, MAX_WAITING = 8, 4


@pytest.fixture(scope="module")
def server(tiny_model_folder):
    with running_server(ServerConfig(max_waiting_requests=MAX_WAITING), model=str(tiny_model_folder),
                        dtype="float32", kv_cache_memory="512KiB", block_size=4, max_num_seqs=MAX_NUM_SEQS) as running:
        yield running


def _complete(server, num_prompts: int, n: int = 1) -> tuple[int, dict, dict]:
    body = {"prompt": [[BOS_ID, 5 + i, 6] for i in range(num_prompts)], "n": n, "max_tokens": 2, "ignore_eos": True}
    status, headers, raw = server.request("POST", "/v1/completions", body)
    return status, headers, json.loads(raw)


@pytest.mark.parametrize("num_prompts, n, param, message", [
    (13, 1, "prompt", "13 prompts with n=1 are 13 sequences; this server holds at most 12 at once (max_num_seqs "
                      "running plus max_waiting_requests waiting): send fewer prompts or a smaller n"),
    (2, 8, "n", "2 prompts with n=8 are 16 sequences; this server holds at most 12 at once (max_num_seqs "
                "running plus max_waiting_requests waiting): send fewer prompts or a smaller n"),
])
def test_a_batch_the_server_can_never_hold_is_a_400_naming_the_field(server, num_prompts, n, param, message):
    rejected = metric(server.metrics(), "jido:requests_rejected_total", reason="overload")
    status, headers, body = _complete(server, num_prompts, n)
    assert (status, body["error"]["param"], body["error"]["message"]) == (400, param, message)
    assert "retry-after" not in headers
    assert metric(server.metrics(), "jido:requests_rejected_total", reason="overload") == rejected


def test_a_batch_that_fills_every_slot_of_an_idle_server_is_served_whole(server):
    status, _, body = _complete(server, MAX_NUM_SEQS + MAX_WAITING)
    assert status == 200
    assert [c["index"] for c in body["choices"]] == list(range(12))
    assert body["usage"]["completion_tokens"] == 24
