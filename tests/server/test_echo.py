"""echo on /v1/completions: the prompt's text and logprobs before the choice's, read as lm-eval-harness reads them."""
from __future__ import annotations

import json
from operator import itemgetter

import pytest
import torch
from server_harness import running_server
from tiny_model_folder import BOS_ID, VOCAB_SIZE, reference_logprobs, token_text

ATOL = 1e-4  # the server computes in float32, the reference in float64
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def server(tiny_model_folder):
    with running_server(model=str(tiny_model_folder), dtype="float32") as server:
        yield server


def _post(server, body: dict) -> dict:
    status, _, raw = server.request("POST", COMPLETIONS, body)
    assert status == 200, raw
    return json.loads(raw)


def _words(seed: int, n: int) -> list[int]:
    return torch.randint(3, VOCAB_SIZE, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _greedy_continuation(folder, context: list[int], n: int) -> list[int]:
    tokens = list(context)
    for _ in range(n):
        tokens.append(int(reference_logprobs(folder, tokens)[-1].argmax()))
    return tokens[len(context):]


def _harness_payload(model: str, prompt: list[int] | str) -> dict:
    """lm-evaluation-harness's local-completions loglikelihood request (``_create_payload``, not generating)."""
    return {"model": model, "prompt": [prompt], "temperature": 0, "max_tokens": 1, "logprobs": 1, "seed": 1234,
            "echo": True}


def _harness_parse(response: dict, ctxlen: int) -> tuple[float, bool]:
    """What the harness's ``parse_logprobs`` makes of a choice: the continuation's summed logprob, and greediness."""
    (choice,) = sorted(response["choices"], key=itemgetter("index"))
    token_logprobs = choice["logprobs"]["token_logprobs"][ctxlen:-1]
    top_logprobs = choice["logprobs"]["top_logprobs"][ctxlen:-1]
    is_greedy = all(logprob == max(top.values()) for logprob, top in zip(token_logprobs, top_logprobs))
    return sum(token_logprobs), is_greedy


@pytest.mark.parametrize("greedy", [True, False])
def test_harness_loglikelihood_request_parses_to_the_reference_loglikelihood(server, tiny_model_folder, greedy):
    folder = tiny_model_folder
    context = [BOS_ID, *_words(1, 9)]
    continuation = _greedy_continuation(folder, context, 4) if greedy else _words(2, 4)
    tokens = context + continuation
    response = _post(server, _harness_payload(server.serving.model_name, tokens))
    reference = reference_logprobs(folder, tokens)
    expected = sum(reference[i - 1, tokens[i]].item() for i in range(len(context), len(tokens)))
    expected_greedy = all(int(reference[i - 1].argmax()) == tokens[i] for i in range(len(context), len(tokens)))
    assert expected_greedy == greedy
    logprob, is_greedy = _harness_parse(response, len(context))
    assert abs(logprob - expected) < ATOL and is_greedy == greedy
    choice = response["choices"][0]
    assert choice["logprobs"]["tokens"][:len(tokens)] == [token_text(t) for t in tokens]
    assert len(choice["logprobs"]["tokens"]) == len(tokens) + 1 and choice["finish_reason"] == "length"
    assert choice["logprobs"]["token_logprobs"][0] is None and choice["logprobs"]["top_logprobs"][0] is None
    assert response["usage"]["completion_tokens"] == 1


def test_text_prompt_is_echoed_as_sent_with_its_tokens_logprobs_and_offsets(server, tiny_model_folder):
    folder = tiny_model_folder
    prompt = "w5 w9 w33 w4"
    response = _post(server, {"prompt": prompt, "echo": True, "max_tokens": 0, "logprobs": 2, "n": 2})
    reference = reference_logprobs(folder, [BOS_ID, 5, 9, 33, 4])
    assert len(response["choices"]) == 2
    for choice in response["choices"]:
        assert (choice["text"], choice["finish_reason"]) == (prompt, "length")
        logprobs = choice["logprobs"]
        assert logprobs["tokens"] == ["<bos>", "w5", "w9", "w33", "w4"]
        assert logprobs["text_offset"] == [0, 5, 7, 9, 12]
        assert logprobs["token_logprobs"][0] is None
        for i, token in enumerate([5, 9, 33, 4], start=1):
            assert abs(logprobs["token_logprobs"][i] - reference[i - 1, token].item()) < ATOL
            top = {token_text(t): reference[i - 1, t].item() for t in reference[i - 1].topk(2).indices.tolist()}
            assert set(logprobs["top_logprobs"][i]) == {token_text(token)} | set(top)
            assert all(abs(logprobs["top_logprobs"][i][t] - v) < ATOL for t, v in top.items())
    assert response["usage"] == {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5,
                                 "prompt_tokens_details": {"cached_tokens": 0}}


def test_echo_without_logprobs_returns_the_prompt_text_in_front_of_the_generated_text(server):
    plain = _post(server, {"prompt": [BOS_ID, 7, 8, 9], "max_tokens": 3, "temperature": 0})["choices"][0]
    echoed = _post(server, {"prompt": [BOS_ID, 7, 8, 9], "max_tokens": 3, "temperature": 0, "echo": True})
    assert echoed["choices"][0]["text"] == "<bos> w7 w8 w9" + plain["text"]
    assert echoed["choices"][0]["logprobs"] is None
    alone = _post(server, {"prompt": [BOS_ID, 7, 8, 9], "max_tokens": 0, "echo": True})["choices"][0]
    assert (alone["text"], alone["logprobs"], alone["finish_reason"]) == ("<bos> w7 w8 w9", None, "length")


def test_streamed_echo_sends_the_prompt_first_then_the_same_tokens_as_the_whole_body(server):
    body = {"prompt": "w11 w12 w13", "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 1,
            "ignore_eos": True}
    whole = _post(server, body)["choices"][0]
    status, _, raw = server.request("POST", COMPLETIONS, {**body, "stream": True})
    assert status == 200
    events = [line[len("data: "):] for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e)["choices"][0] for e in events[:-1]]
    assert chunks[0]["text"] == "w11 w12 w13" and chunks[0]["logprobs"]["tokens"] == ["<bos>", "w11", "w12", "w13"]
    assert "".join(c["text"] for c in chunks) == whole["text"]
    for key in ("tokens", "token_logprobs", "top_logprobs"):
        assert [x for c in chunks for x in c["logprobs"][key]] == whole["logprobs"][key]
    assert chunks[-1]["finish_reason"] == "length"


def test_harness_batch_of_requests_in_one_body_scores_each_as_it_would_alone(server, tiny_model_folder):
    # lm-eval's local-completions with batch_size > 1 sends its contexts as one list and sorts choices by index.
    contexts = [[BOS_ID, *_words(seed, 6 + seed)] for seed in (3, 4, 5)]
    continuations = [_words(10 + seed, 3) for seed in (3, 4, 5)]
    payload = {**_harness_payload(server.serving.model_name, []), "prompt": [c + x for c, x in
                                                                             zip(contexts, continuations)]}
    batched = _post(server, payload)
    assert sorted(c["index"] for c in batched["choices"]) == [0, 1, 2]
    for i, (context, continuation) in enumerate(zip(contexts, continuations)):
        alone = _post(server, _harness_payload(server.serving.model_name, context + continuation))
        choice = next(c for c in batched["choices"] if c["index"] == i)
        assert choice["text"] == alone["choices"][0]["text"]
        ours, single = choice["logprobs"], alone["choices"][0]["logprobs"]
        assert ours["tokens"] == single["tokens"] and ours["text_offset"] == single["text_offset"]
        # Batched rows may round differently from a lone one: the same within float32 noise.
        assert ours["token_logprobs"][0] is None
        assert ours["token_logprobs"][1:] == pytest.approx(single["token_logprobs"][1:], abs=ATOL)
        tokens = context + continuation
        reference = reference_logprobs(tiny_model_folder, tokens)
        expected = sum(reference[j - 1, tokens[j]].item() for j in range(len(context), len(tokens)))
        assert abs(_harness_parse({"choices": [choice]}, len(context))[0] - expected) < ATOL
    assert batched["usage"]["prompt_tokens"] == sum(len(c) + len(x) for c, x in zip(contexts, continuations))
    assert batched["usage"]["completion_tokens"] == 3


def test_batched_prompts_number_choices_prompt_major_and_stream_the_same_text(server):
    prompts = ["w7 w8", "w20 w21 w22 w23"]
    body = {"prompt": prompts, "max_tokens": 5, "n": 2, "temperature": 0, "ignore_eos": True}
    whole = _post(server, body)
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2, 3]
    for i, prompt in enumerate(prompts):
        alone = _post(server, {**body, "prompt": prompt})["choices"]
        assert [c["text"] for c in whole["choices"][2 * i:2 * i + 2]] == [c["text"] for c in alone]
    assert whole["usage"]["completion_tokens"] == 4 * 5
    status, _, raw = server.request("POST", COMPLETIONS, {**body, "stream": True,
                                                          "stream_options": {"include_usage": True}})
    assert status == 200
    events = [json.loads(line[len("data: "):]) for line in raw.decode().split("\n")
              if line.startswith("data: ") and line != "data: [DONE]"]
    texts = {i: "".join(c["text"] for e in events for c in e["choices"] if c["index"] == i) for i in range(4)}
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}
    assert events[-1]["choices"] == [] and events[-1]["usage"] == whole["usage"]
    assert raw.decode().rstrip().endswith("data: [DONE]")
