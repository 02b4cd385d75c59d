"""Chat templates: the checkpoint's own (Qwen2.5's, with tools), --chat-template FILE, and none at all."""
from __future__ import annotations

from pathlib import Path

import pytest

from jido.engine.chat_template import ChatTemplate, ChatTemplateError, load_chat_template
from jido.models.tokenizer import Tokenizer

GEMMA_TEMPLATE = Path(__file__).parents[1] / "fixtures" / "gemma3_chat_template.jinja"

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Sky colour?"}]


class FakeTokenizer:
    """What load_chat_template reads from a Tokenizer."""

    def __init__(self, chat_template: str | None = None) -> None:
        self.chat_template = chat_template
        self.bos_token_id = 2
        self.eos_token_ids = [1]

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [{1: "<eos>", 2: "<bos>"}[i] for i in ids]


def test_a_checkpoint_without_a_template_gets_none_unless_a_file_is_given():
    assert load_chat_template(FakeTokenizer()) is None
    assert load_chat_template(FakeTokenizer(), GEMMA_TEMPLATE).render(CHAT[1:2]).startswith("<bos><start_of_turn>")


def test_gemma_format_folds_the_system_prompt_into_the_first_user_turn():
    template = load_chat_template(FakeTokenizer(), GEMMA_TEMPLATE)
    assert template.render(CHAT) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nSky colour?<end_of_turn>\n"
        "<start_of_turn>model\n")


def test_gemma_format_renders_a_system_message_alone_as_the_user_turn():
    template = load_chat_template(FakeTokenizer(), GEMMA_TEMPLATE)
    assert template.render(CHAT[:1]) == "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n"


def test_gemma_format_without_generation_prompt_ends_after_the_last_turn():
    template = load_chat_template(FakeTokenizer(), GEMMA_TEMPLATE)
    assert template.render(CHAT[1:2], add_generation_prompt=False) == "<bos><start_of_turn>user\nHi<end_of_turn>\n"


def test_a_file_wins_over_the_checkpoint_template(tmp_path):
    own = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}{{ eos_token }}"
    assert load_chat_template(FakeTokenizer(own)).render(CHAT[1:2]) == "[user]Hi<eos>"
    path = tmp_path / "template.jinja"
    path.write_text("{{ bos_token }}{{ messages | length }}{% if add_generation_prompt %}>{% endif %}")
    assert load_chat_template(FakeTokenizer(own), path).render(CHAT) == "<bos>4>"


def test_tools_reach_the_template_as_json_without_html_escapes():
    template = ChatTemplate("{% for t in tools %}{{ t | tojson }}{% endfor %}|{{ tools | tojson(indent=1) }}")
    tools = [{"name": "f", "description": "a < b & 'c'"}]
    assert template.render(CHAT[1:2], tools=tools) == (
        '{"name": "f", "description": "a < b & \'c\'"}|[\n {\n  "name": "f",\n  "description": "a < b & \'c\'"\n }\n]')


@pytest.mark.slow
def test_template_kwargs_are_variables_of_the_template():
    template = ChatTemplate("{% if enable_thinking %}<think>{% endif %}{{ messages[0]['content'] }}")
    assert template.render(CHAT[1:2], template_kwargs={"enable_thinking": True}) == "<think>Hi"
    assert template.render(CHAT[1:2], template_kwargs={"enable_thinking": False}) == "Hi"
    assert template.render(CHAT[1:2]) == "Hi"


def test_qwen_renders_its_own_template_as_transformers_does(qwen_folder, qwen_reference):
    # System messages, the default system prompt, and tools are each placed where Qwen2.5's template says.
    tokenizer = Tokenizer.from_folder(qwen_folder)
    template = load_chat_template(tokenizer)
    assert {case["name"] for case in qwen_reference["chat_cases"]} == {"user_only", "system", "tools",
                                                                       "tools_and_system"}
    for case in qwen_reference["chat_cases"]:
        text = template.render(case["messages"], tools=case.get("tools"))
        assert text == case["text"], case["name"]
        assert tokenizer.encode(text, add_special_tokens=False) == case["ids"], case["name"]


def test_template_problems_are_value_errors_that_say_what_to_do(tmp_path):
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        load_chat_template(FakeTokenizer(), GEMMA_TEMPLATE).render(CHAT[1:2] * 2)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_chat_template(FakeTokenizer(), tmp_path / "missing.jinja")
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="messages is empty"):
        ChatTemplate("x").render([])
