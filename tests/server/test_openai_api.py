"""The official openai client against a real server: completions and chat, streaming and not."""
from __future__ import annotations

import pytest

from server_harness import running_server

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def server():
    with running_server() as server:
        yield server


@pytest.fixture(scope="module")
def client(server):
    return server.client()


def test_models_lists_the_served_model(client):
    assert [m.id for m in client.models.list().data] == ["gemma-3-270m"]


def test_completion_matches_the_engine_run_directly(server, client):
    response = client.completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=8, temperature=0)
    llm = server.serving.llm
    choice = response.choices[0]
    assert response.object == "text_completion"
    assert choice.finish_reason in ("length", "stop")
    assert response.usage.prompt_tokens == len(llm.tokenizer.encode(PROMPT))
    assert response.usage.completion_tokens == len(llm.tokenizer.encode(choice.text, add_special_tokens=False))
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens


def test_streamed_completion_text_equals_non_streamed_for_the_same_seed(client):
    kwargs = dict(model="gemma-3-270m", prompt=PROMPT, max_tokens=12, temperature=0.9, seed=1234,
                  extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert streamed == whole.choices[0].text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_chat_uses_the_gemma_turn_format(server, client):
    response = client.chat.completions.create(model="gemma-3-270m", messages=MESSAGES, max_tokens=8,
                                              temperature=0)
    expected_prompt = "<bos><start_of_turn>user\nName three colours.<end_of_turn>\n<start_of_turn>model\n"
    tokenizer = server.serving.llm.tokenizer
    assert response.object == "chat.completion"
    assert response.choices[0].message.role == "assistant"
    assert response.usage.prompt_tokens == len(tokenizer.encode(expected_prompt, add_special_tokens=False))


def test_streamed_chat_equals_non_streamed_chat(client):
    kwargs = dict(model="gemma-3-270m", messages=MESSAGES, max_tokens=10, temperature=0.7, seed=7)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_n_3_returns_three_seeded_completions(client):
    kwargs = dict(model="gemma-3-270m", prompt=PROMPT, max_tokens=6, temperature=1.0, seed=5, n=3,
                  extra_body={"ignore_eos": True})
    response = client.completions.create(**kwargs)
    assert sorted(c.index for c in response.choices) == [0, 1, 2]
    assert response.usage.completion_tokens == 18
    streamed = ["", "", ""]
    for chunk in client.completions.create(**kwargs, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == [c.text for c in sorted(response.choices, key=lambda c: c.index)]


def test_stop_string_ends_the_text_before_it(client):
    greedy = dict(model="gemma-3-270m", prompt="1, 2, 3, 4, 5,", temperature=0, max_tokens=16)
    free = client.completions.create(**greedy).choices[0].text
    stop = free.strip().split()[2]  # a word the model does produce, a few tokens in
    stopped = client.completions.create(**greedy, stop=[stop]).choices[0]
    assert stopped.finish_reason == "stop"
    assert stopped.text == free[:free.index(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(**greedy, stop=[stop], stream=True))
    assert streamed == stopped.text


def test_repeated_prefix_reports_cached_tokens(client):
    prompt = "A long shared system preamble that several requests reuse. " * 8 + "Question one?"
    first = client.completions.create(model="gemma-3-270m", prompt=prompt, max_tokens=2, temperature=0)
    second = client.completions.create(model="gemma-3-270m", prompt=prompt.replace("one", "two"), max_tokens=2,
                                       temperature=0)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.usage.prompt_tokens_details.cached_tokens >= 16  # at least one full block
    assert second.usage.prompt_tokens_details.cached_tokens % 16 == 0


def test_logprobs_are_reported_for_completions_and_chat(client):
    completion = client.completions.create(model="gemma-3-270m", prompt=PROMPT, max_tokens=3, temperature=0,
                                           logprobs=2)
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) == 3
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    chat = client.chat.completions.create(model="gemma-3-270m", messages=MESSAGES, max_tokens=3, temperature=0,
                                          logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in content)
