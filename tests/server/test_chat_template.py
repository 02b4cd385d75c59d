"""Chat templates: the built-in family formats, the checkpoint's own template, and --chat-template FILE."""
from __future__ import annotations

import pytest

from jido.engine.chat_template import ChatTemplate, ChatTemplateError, builtin_template, load_chat_template

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


def test_gemma_format_folds_the_system_prompt_into_the_first_user_turn():
    template = load_chat_template(FakeTokenizer(), "Gemma3ForCausalLM")
    assert template.render(CHAT) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nSky colour?<end_of_turn>\n"
        "<start_of_turn>model\n")


def test_gemma_format_renders_a_system_message_alone_as_the_user_turn():
    template = load_chat_template(FakeTokenizer(), "Gemma3ForCausalLM")
    assert template.render(CHAT[:1]) == "<bos><start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n"


def test_gemma_format_without_generation_prompt_ends_after_the_last_turn():
    template = load_chat_template(FakeTokenizer(), "Gemma3ForCausalLM")
    assert template.render(CHAT[1:2], add_generation_prompt=False) == "<bos><start_of_turn>user\nHi<end_of_turn>\n"


def test_llama3_and_chatml_formats():
    llama = ChatTemplate(builtin_template("LlamaForCausalLM"), bos_token="<|begin_of_text|>")
    assert llama.render(CHAT[:2]) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    chatml = ChatTemplate(builtin_template("Qwen2ForCausalLM"))
    assert chatml.render(CHAT[:2]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_checkpoint_template_wins_over_the_builtin_and_a_file_wins_over_both(tmp_path):
    own = "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}{{ eos_token }}"
    assert load_chat_template(FakeTokenizer(own), "Gemma3ForCausalLM").render(CHAT[1:2]) == "[user]Hi<eos>"
    path = tmp_path / "template.jinja"
    path.write_text("{{ bos_token }}{{ messages | length }}{% if add_generation_prompt %}>{% endif %}")
    assert load_chat_template(FakeTokenizer(own), "Gemma3ForCausalLM", path).render(CHAT) == "<bos>4>"


def test_template_problems_are_value_errors_that_say_what_to_do(tmp_path):
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        load_chat_template(FakeTokenizer(), "Gemma3ForCausalLM").render(CHAT[1:2] * 2)
    with pytest.raises(ValueError, match="--chat-template FILE"):
        load_chat_template(FakeTokenizer(), "MistralForCausalLM")
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_chat_template(FakeTokenizer(), "Gemma3ForCausalLM", tmp_path / "missing.jinja")
    with pytest.raises(ValueError, match="does not compile"):
        ChatTemplate("{% for m in messages %}")
    with pytest.raises(ChatTemplateError, match="messages is empty"):
        ChatTemplate("x").render([])
