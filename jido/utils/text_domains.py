"""The quality gate's texts: a held-out set per domain that no calibration or tuning reads, and a separate
calibration set of the same domains (``jido/utils/corpora/``; where each text came from: ``corpora/SOURCES.md``)."""
from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

CORPORA = Path(__file__).parent / "corpora"
Split = Literal["heldout", "calibration"]
SPLITS: tuple[Split, ...] = ("heldout", "calibration")
# Every domain in both splits; chat is stored as conversations and rendered per model (see domain_text).
DOMAINS: tuple[str, ...] = ("prose_en", "code_python", "code_c", "chat", "prose_ko", "numbers_tables")
CHAT = "chat"

Messages = list[dict[str, Any]]
RenderChat = Callable[[Messages], str]


def conversations(split: Split) -> list[Messages]:
    """The chat domain's conversations in ``split``: each a list of ``{"role", "content"}`` messages."""
    lines = _path(split, CHAT).read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["messages"] for line in lines if line.strip()]


def plain_transcript(messages: Messages) -> str:
    """A conversation as ``Role: content`` paragraphs: the rendering for a model without a chat template."""
    return "\n\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in messages) + "\n"


def domain_text(split: Split, domain: str, render_chat: RenderChat = plain_transcript) -> str:
    """The text of ``domain`` in ``split``; chat conversations rendered by ``render_chat`` (the model's chat
    template, where it has one) and joined by blank lines.

    Raises:
        ValueError: ``split`` or ``domain`` is not one of :data:`SPLITS` / :data:`DOMAINS`.
    """
    if split not in SPLITS:
        raise ValueError(f"split {split!r} is not one of {', '.join(SPLITS)}")
    if domain not in DOMAINS:
        raise ValueError(f"domain {domain!r} is not one of {', '.join(DOMAINS)}")
    if domain == CHAT:
        return "\n\n".join(render_chat(messages) for messages in conversations(split))
    return _path(split, domain).read_text(encoding="utf-8")


def parse_domains(value: str) -> tuple[str, ...]:
    """``all`` or a comma-separated list of domains, checked; ValueError names the unknown ones."""
    if value.strip() == "all":
        return DOMAINS
    names = tuple(dict.fromkeys(name.strip() for name in value.split(",") if name.strip()))
    unknown = [name for name in names if name not in DOMAINS]
    if not names or unknown:
        raise ValueError(f"unknown domain(s) {', '.join(unknown) or repr(value)}: give 'all' or a comma-separated "
                         f"list of {', '.join(DOMAINS)}")
    return names


def _path(split: Split, domain: str) -> Path:
    return CORPORA / split / (f"{domain}.jsonl" if domain == CHAT else f"{domain}.txt")
