"""ChatTemplate: renders chat messages into a prompt with the model's Jinja template or a built-in one."""
from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from jido.models.tokenizer import Tokenizer

# Built-in formats for checkpoints that carry no template (the default GGUF has none). Each follows the
# family's official template, trimmed to text-only messages.
_GEMMA = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' and messages | length > 1 -%}"
    "{%- set first_user_prefix = messages[0]['content'] + '\\n\\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    # A system message alone has no user turn to fold into (the official template drops its text): it
    # becomes the user turn.
    "{%- elif messages[0]['role'] == 'system' -%}{%- set first_user_prefix = '' -%}"
    "{%- set loop_messages = [{'role': 'user', 'content': messages[0]['content']}] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\\n' + (first_user_prefix if loop.first else '') }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}"
)
_LLAMA3 = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ message['content'] | trim }}{{ '<|eot_id|>' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif -%}"
)
_CHATML = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
# HF architecture name prefix -> built-in template.
_BUILTIN = {"Gemma": _GEMMA, "Llama": _LLAMA3, "Qwen": _CHATML}


class ChatTemplateError(ValueError):
    """The messages cannot be rendered: the template rejected them or failed on them."""


class ChatTemplate:
    """A compiled Jinja chat template, rendered the way transformers' ``apply_chat_template`` does.

    The template sees ``messages`` (dicts with ``role`` and string ``content``), ``add_generation_prompt``,
    ``bos_token`` and ``eos_token``, plus the helpers ``raise_exception`` and ``strftime_now``.
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt text for ``messages``; raises ChatTemplateError when the template refuses them."""
        if not messages:
            raise ChatTemplateError("messages is empty: give at least one message")
        try:
            return self._template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         bos_token=self.bos_token, eos_token=self.eos_token)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed on these messages: {exc}") from exc


def load_chat_template(tokenizer: Tokenizer, architecture: str, path: str | Path | None = None) -> ChatTemplate:
    """The template to use: ``path`` if given, else the checkpoint's own, else the family's built-in.

    Raises FileNotFoundError for a missing ``path`` and ValueError when none applies to ``architecture``.
    """
    if path is not None:
        path = Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"chat template {str(path)!r}: no such file")
        source = path.read_text(encoding="utf-8")
    else:
        source = tokenizer.chat_template or builtin_template(architecture)
    return ChatTemplate(source, _token_text(tokenizer, tokenizer.bos_token_id),
                        _token_text(tokenizer, (tokenizer.eos_token_ids or [None])[0]))


def builtin_template(architecture: str) -> str:
    for prefix, template in _BUILTIN.items():
        if architecture.startswith(prefix):
            return template
    raise ValueError(f"no built-in chat template for {architecture!r} (jido knows {', '.join(_BUILTIN)}); "
                     "pass --chat-template FILE with a Jinja template")


def _token_text(tokenizer: Tokenizer, token_id: int | None) -> str:
    return "" if token_id is None else tokenizer.convert_ids_to_tokens([token_id])[0]


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template refused the messages: {message}")
