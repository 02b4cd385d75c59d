"""ChatTemplate: renders chat messages (and tools) into a prompt with the model's Jinja template or --chat-template's."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from jido.models.tokenizer import Tokenizer

# vLLM's rule since transformers 4.44 dropped default templates: no guessed format for a model without one.
NO_TEMPLATE = ("this model has no chat template (a base model, such as gemma-3-270m, has none), so it cannot "
               "serve chat: start the server with --chat-template FILE (a Jinja template), or send the text to "
               "/v1/completions")


# What render() itself gives the template; a request's chat_template_kwargs may not replace them.
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "add_generation_prompt", "tools", "bos_token", "eos_token",
                                         "raise_exception", "strftime_now"})


class ChatTemplateError(ValueError):
    """The messages cannot be rendered: the template rejected them or failed on them."""


class ChatTemplate:
    """A compiled Jinja chat template, rendered the way transformers' ``apply_chat_template`` does.

    The template sees ``messages`` (dicts with ``role`` and string ``content``), ``add_generation_prompt``,
    ``tools`` (OpenAI's tool list, or None), ``bos_token`` and ``eos_token``, plus the helpers
    ``raise_exception``, ``strftime_now`` and transformers' ``tojson``; how tools and system messages appear
    is the template's call. A request's ``template_kwargs`` are more variables, as transformers' and vLLM's
    ``chat_template_kwargs`` (``enable_thinking``, ...).
    """

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        env.filters["tojson"] = _tojson
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"chat template does not compile: {exc}") from exc
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None, template_kwargs: dict[str, Any] | None = None) -> str:
        """The prompt text for ``messages``; raises ChatTemplateError when the template refuses them. NOTE:
        ``template_kwargs`` never replace RESERVED_TEMPLATE_VARIABLES (the server refuses such a request)."""
        if not messages:
            raise ChatTemplateError("messages is empty: give at least one message")
        variables = {**(template_kwargs or {}), "messages": messages, "add_generation_prompt": add_generation_prompt,
                     "tools": tools, "bos_token": self.bos_token, "eos_token": self.eos_token}
        try:
            return self._template.render(variables)
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"chat template failed on these messages: {exc}") from exc


def load_chat_template(tokenizer: Tokenizer, path: str | Path | None = None) -> ChatTemplate | None:
    """The template to use: ``path`` if given, else the checkpoint's own, else None (chat is refused).

    Raises FileNotFoundError for a missing ``path`` and ValueError for a template that does not compile.
    """
    if path is not None:
        path = Path(path).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"chat template {str(path)!r}: no such file")
        source = path.read_text(encoding="utf-8")
    elif tokenizer.chat_template is None:
        return None
    else:
        source = tokenizer.chat_template
    return ChatTemplate(source, _token_text(tokenizer, tokenizer.bos_token_id),
                        _token_text(tokenizer, (tokenizer.eos_token_ids or [None])[0]))


def _token_text(tokenizer: Tokenizer, token_id: int | None) -> str:
    return "" if token_id is None else tokenizer.convert_ids_to_tokens([token_id])[0]


def _tojson(value: Any, indent: int | None = None) -> str:
    # transformers' filter: Jinja's own escapes <, >, & and ' for HTML, which a prompt must not see.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template refused the messages: {message}")
