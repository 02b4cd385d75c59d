"""A chat request's chat_template_kwargs reach the chat template as variables, as vLLM passes them."""
from __future__ import annotations

import json

from server_harness import running_server

from jido.server.config import ServerConfig

# Word-level tiny tokenizer: each w<id> is one token, so the prompt's length says what the template wrote.
TEMPLATE = "{{ bos_token }}{% if verbose %}w10 w11 w12 {% endif %}{{ messages[-1]['content'] }}"


def test_chat_template_kwargs_are_variables_of_the_chat_template(tiny_model_folder, tmp_path):
    (tmp_path / "template.jinja").write_text(TEMPLATE)
    config = ServerConfig(chat_template=str(tmp_path / "template.jinja"))
    with running_server(config, model=str(tiny_model_folder), dtype="float32", kv_cache_memory="512KiB",
                        block_size=4) as server:
        prompt_tokens = []
        for kwargs in ({}, {"chat_template_kwargs": {"verbose": True}}, {"chat_template_kwargs": {"verbose": False}}):
            body = {"messages": [{"role": "user", "content": "w5 w6"}], "max_tokens": 1, **kwargs}
            status, _, raw = server.request("POST", "/v1/chat/completions", body)
            assert status == 200, raw
            prompt_tokens.append(json.loads(raw)["usage"]["prompt_tokens"])
    assert prompt_tokens == [3, 6, 3]  # <bos> w5 w6, with w10 w11 w12 only when verbose
