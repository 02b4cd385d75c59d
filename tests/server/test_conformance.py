"""The last gaps to OpenAI's and vLLM's wire formats (issue 55), on a tiny random model through the openai client:
streamed text_offset, usage on stream chunks, the model object, /tokenizer_info and prompt_logprobs."""
from __future__ import annotations

import json
import time
from pathlib import Path

import jinja2
import openai
import pytest
import torch
from server_harness import GEMMA_CHAT_TEMPLATE, running_server
from tiny_model_folder import BOS_ID, EOS_ID, reference_logprobs, token_text

from jido.server.config import ServerConfig

ATOL = 1e-4  # the server computes in float32, the reference in float64
PROMPT = "w5 w9 w33 w4 w17"
PROMPT_IDS = [BOS_ID, 5, 9, 33, 4, 17]
MESSAGES = [{"role": "user", "content": "w5 w9"}]


@pytest.fixture(scope="module")
def server(tiny_model_folder):
    started = int(time.time())
    config = ServerConfig(chat_template=GEMMA_CHAT_TEMPLATE, enable_tokenizer_info_endpoint=True)
    with running_server(config, model=str(tiny_model_folder), dtype="float32") as server:
        server.started = started
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def _events(server, path: str, body: dict) -> list[dict]:
    """A stream's chunks as the server wrote them (the openai client reads a missing field and null alike)."""
    status, _, raw = server.request("POST", path, {**body, "stream": True})
    assert status == 200, raw
    lines = raw.decode().split("\n")
    assert "data: [DONE]" in lines
    return [json.loads(line[len("data: "):]) for line in lines if line.startswith("data: ") and line != "data: [DONE]"]


def _model(server) -> str:
    return server.serving.model_name


# -- text_offset ----------------------------------------------------------------------------------


@pytest.mark.parametrize("echo", [False, True])
def test_streamed_logprobs_laid_end_to_end_are_the_unstreamed_answers_offsets_included(client, server, echo):
    kwargs = dict(model=_model(server), prompt=PROMPT, max_tokens=8, logprobs=2, temperature=1.0, seed=7,
                  echo=echo, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs).choices[0]
    chunks = [c.choices[0] for c in client.completions.create(**kwargs, stream=True) if c.choices]
    tokens = [t for c in chunks for t in c.logprobs.tokens]
    offsets = [o for c in chunks for o in c.logprobs.text_offset]
    assert len(chunks) > 2  # the offsets of several chunks, each after the one before's
    assert "".join(c.text for c in chunks) == whole.text
    assert tokens == whole.logprobs.tokens
    assert offsets == whole.logprobs.text_offset
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]


# -- usage on stream chunks -------------------------------------------------------------------------


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT}),
    ("/v1/chat/completions", {"messages": MESSAGES}),
])
def test_with_include_usage_every_chunk_has_usage_null_but_the_last_which_has_the_counts(server, path, body):
    # OpenAI's reference: "All other chunks will also include a usage field, but with a null value."
    body = {**body, "model": _model(server), "max_tokens": 6, "temperature": 0, "ignore_eos": True}
    events = _events(server, path, {**body, "stream_options": {"include_usage": True}})
    *chunks, last = events
    assert len(chunks) > 1 and all("usage" in c and c["usage"] is None for c in chunks)
    assert last["choices"] == []
    status, _, raw = server.request("POST", path, body)
    assert status == 200 and last["usage"] == json.loads(raw)["usage"]
    assert all("usage" not in c for c in _events(server, path, body))  # without include_usage: no field at all


def test_continuous_usage_stats_put_the_counts_so_far_on_every_chunk(server):
    body = {"model": _model(server), "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "logprobs": 0, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    *chunks, last = _events(server, "/v1/completions", body)
    num_sent = 0
    for chunk in chunks:
        num_sent += len(chunk["choices"][0]["logprobs"]["tokens"])
        assert chunk["usage"] == {"prompt_tokens": len(PROMPT_IDS), "completion_tokens": num_sent,
                                  "total_tokens": len(PROMPT_IDS) + num_sent,
                                  "prompt_tokens_details": {"cached_tokens": chunk["usage"]["prompt_tokens_details"]
                                                            ["cached_tokens"]}}
    assert num_sent == 6 and last["choices"] == [] and last["usage"]["completion_tokens"] == 6
    # Without include_usage, vLLM ignores continuous_usage_stats.
    quiet = _events(server, "/v1/completions", {**body, "stream_options": {"continuous_usage_stats": True}})
    assert all("usage" not in c for c in quiet)


def test_continuous_usage_stats_on_chat_start_with_the_prompt_alone(server):
    body = {"model": _model(server), "messages": MESSAGES, "max_tokens": 4, "temperature": 0, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    role, *chunks, last = _events(server, "/v1/chat/completions", body)
    num_prompt = last["usage"]["prompt_tokens"]
    assert role["choices"][0]["delta"]["role"] == "assistant"
    assert role["usage"] == {"prompt_tokens": num_prompt, "completion_tokens": 0, "total_tokens": num_prompt}
    counts = [c["usage"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == last["usage"]["completion_tokens"] == 4
    assert all(c["usage"]["prompt_tokens"] == num_prompt for c in chunks)


# -- the model object -------------------------------------------------------------------------------


def test_models_retrieve_gives_the_served_model_created_when_the_server_started(client, server):
    model = client.models.retrieve(_model(server))
    assert (model.id, model.object, model.owned_by) == (_model(server), "model", "jido")
    assert server.started <= model.created <= int(time.time())
    assert client.models.list().data == [model]


def test_models_retrieve_of_an_unknown_model_is_openais_404(client, server):
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4o")
    assert caught.value.body["code"] == "model_not_found" and caught.value.body["param"] == "model"
    status, _, raw = server.request("GET", "/v1/models/org/gpt-4o")  # a name with a slash is still one id
    error = json.loads(raw)["error"]
    assert status == 404 and set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("invalid_request_error", "model_not_found")
    assert "'org/gpt-4o' does not exist" in error["message"]


# -- /tokenizer_info --------------------------------------------------------------------------------


def test_tokenizer_info_has_what_lm_eval_remote_tokenizer_reads(server):
    status, _, raw = server.request("GET", "/tokenizer_info")
    info = json.loads(raw)
    assert status == 200
    assert info == {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>",
                    "tokenizer_class": "PreTrainedTokenizerFast",
                    "chat_template": Path(GEMMA_CHAT_TEMPLATE).read_text(encoding="utf-8")}
    # lm-eval's RemoteTokenizer: eos_token_id is its text tokenized without special tokens; chat is the template
    # rendered by jinja2 on the client.
    status, _, raw = server.request("POST", "/tokenize", {"prompt": info["eos_token"], "add_special_tokens": False})
    assert json.loads(raw)["tokens"] == [EOS_ID]
    rendered = jinja2.Environment().from_string(info["chat_template"]).render(
        messages=MESSAGES, add_generation_prompt=True, bos_token=info["bos_token"])
    assert rendered == server.serving.chat_template.render(MESSAGES)


def test_tokenizer_info_is_served_only_when_enabled(server):
    from jido.server.app import create_app

    from starlette.testclient import TestClient

    app = create_app(server.serving.llm, ServerConfig(chat_template=GEMMA_CHAT_TEMPLATE))
    assert TestClient(app).get("/tokenizer_info").status_code == 404  # without its lifespan: no engine thread
    assert server.request("GET", "/tokenizer_info")[0] == 200


# -- prompt_logprobs --------------------------------------------------------------------------------


def _check_prompt_logprobs(prompt_logprobs: list, folder: Path, token_ids: list[int], num_top: int) -> None:
    """vLLM's shape: None, then per position {token id: {logprob, rank, decoded_token}}, the prompt token and the
    top ``num_top``; values against transformers' float64 log-softmax."""
    reference = reference_logprobs(folder, token_ids)
    assert len(prompt_logprobs) == len(token_ids) and prompt_logprobs[0] is None
    for position, (token_id, entries) in enumerate(zip(token_ids[1:], prompt_logprobs[1:]), 1):
        row = reference[position - 1]
        top_ids = torch.topk(row, num_top).indices.tolist()
        assert list(entries)[0] == str(token_id)
        assert set(entries) == {str(t) for t in [token_id, *top_ids]}
        for key, entry in entries.items():
            assert set(entry) == {"logprob", "rank", "decoded_token"}
            assert entry["logprob"] == pytest.approx(row[int(key)].item(), abs=ATOL)
            assert entry["rank"] == 1 + int((row > row[int(key)]).sum())
            assert entry["decoded_token"] == token_text(int(key))


def test_completions_prompt_logprobs_come_in_every_choice_as_vllm_gives_them(client, server, tiny_model_folder):
    response = client.completions.create(model=_model(server), prompt=PROMPT, max_tokens=2, n=2, temperature=1,
                                         seed=3, extra_body={"prompt_logprobs": 3})
    assert len(response.choices) == 2
    for choice in response.choices:
        _check_prompt_logprobs(choice.prompt_logprobs, tiny_model_folder, PROMPT_IDS, 3)
    plain = client.completions.create(model=_model(server), prompt=PROMPT, max_tokens=2)
    assert "prompt_logprobs" not in plain.choices[0].model_extra


def test_chat_prompt_logprobs_come_once_for_the_request_as_vllm_gives_them(client, server, tiny_model_folder):
    response = client.chat.completions.create(model=_model(server), messages=MESSAGES, max_tokens=2,
                                              extra_body={"prompt_logprobs": 1})
    prompt_ids = server.serving.llm.tokenizer.encode(server.serving.chat_template.render(MESSAGES),
                                                     add_special_tokens=False)
    assert response.usage.prompt_tokens == len(prompt_ids)
    _check_prompt_logprobs(response.prompt_logprobs, tiny_model_folder, prompt_ids, 1)
    assert "prompt_logprobs" not in response.choices[0].model_extra


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT}),
    ("/v1/chat/completions", {"messages": MESSAGES}),
])
def test_prompt_logprobs_with_stream_or_out_of_range_are_400s_naming_the_field(server, path, body):
    body = {**body, "model": _model(server), "max_tokens": 2}
    for bad in ({"prompt_logprobs": 2, "stream": True}, {"prompt_logprobs": -1}, {"prompt_logprobs": 21}):
        status, _, raw = server.request("POST", path, {**body, **bad})
        assert status == 400 and json.loads(raw)["error"]["param"] == "prompt_logprobs", raw
    assert _events(server, path, {**body, "prompt_logprobs": 0})  # 0 asks for none: a stream is fine, as vLLM
