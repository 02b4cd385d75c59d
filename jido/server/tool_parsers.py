"""Tool-call parsers: a chat answer's text split, as it streams, into content and OpenAI tool calls.

Every parser reads the text incrementally (``feed`` each new piece, then ``finish``) and says what it found as
``ToolEvent``s: text that is content, a call's start (its index and name) and fragments of its arguments. The
non-streamed answer is the same events over the whole text, so streamed deltas reassemble to it exactly.
Arguments are the model's JSON with whitespace outside strings removed and vLLM's separators (``", "``,
``": "``); strings are kept as the model wrote them.
"""
from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

TOOL_CALL_PARSERS = ("hermes", "llama3_json")
_ARGUMENT_KEYS = ("arguments", "parameters")  # Hermes/Qwen say arguments, Llama 3 parameters


@dataclass(frozen=True)
class ToolEvent:
    """``content``: ``text`` is content; ``call``: call ``index`` named ``text`` starts; ``arguments``: ``text``
    continues call ``index``'s arguments."""

    kind: Literal["content", "call", "arguments"]
    text: str
    index: int = 0


class _CallScanner:
    """One JSON object read a character at a time: the string under key ``name`` and, normalized, the value under
    ``arguments`` (or ``parameters``); ``done`` once the object closes, ``error`` on text that is not JSON."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = self.escape = False
        self.expect_key = False
        self.key = ""  # the depth-1 key being read, or whose value is being read
        self.reading_key = False
        self.name_raw: str | None = None
        self.arguments = ""
        self.done = self.error = False

    @property
    def name(self) -> str | None:
        if self.name_raw is None or self.in_string and self.key == "name" and not self.reading_key:
            return None
        try:
            return json.loads(f'"{self.name_raw}"')
        except json.JSONDecodeError:
            return None

    def feed(self, char: str) -> None:
        if self.in_string:
            self._string_char(char)
        elif not char.isspace():
            self._structural(char)

    def _string_char(self, char: str) -> None:
        closing = char == '"' and not self.escape
        self.escape = char == "\\" and not self.escape
        if closing:
            self.in_string = False
        if self.reading_key:
            if closing:
                self.reading_key = False
            else:
                self.key += char
        elif self.depth == 1 and self.key == "name":
            if not closing:
                self.name_raw = (self.name_raw or "") + char
        self._argument(char)

    def _structural(self, char: str) -> None:
        if self.depth == 0:
            if char != "{":
                self.error = True
                return
            self.depth, self.expect_key = 1, True
            return
        if self.depth == 1 and char in ",}":
            self.key, self.expect_key = "", char == ","
            if char == "}":
                self.depth, self.done = 0, True
            return
        if self.depth == 1 and self.expect_key:
            if char == '"':
                self.in_string = self.reading_key = True
            elif char == ":":
                self.expect_key = False
            else:
                self.error = True
            return
        if char == '"':
            self.in_string = True
            self.name_raw = "" if self.depth == 1 and self.key == "name" else self.name_raw
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
        self._argument({",": ", ", ":": ": "}.get(char, char))

    def is_valid(self) -> bool:
        """A name, and arguments that are a JSON object."""
        try:
            return self.name is not None and isinstance(json.loads(self.arguments), dict)
        except json.JSONDecodeError:
            return False

    def _argument(self, text: str) -> None:
        if self.key in _ARGUMENT_KEYS and not self.reading_key and not self.expect_key:
            self.arguments += text


class ToolCallParser:
    """Calls in Hermes' ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks (Qwen2.5's format),
    or, as Qwen2.5-Coder often answers, a call object (or an array of them) that starts the answer or follows
    another call, bare or in a code fence, whose name is one of the request's tools. ``llama3_json`` adds Llama 3's
    ``<|python_tag|>`` opener, its ``parameters`` key and ``;`` between calls. Text around the calls is content,
    less the whitespace next to them. A call that is not valid JSON sets ``failed``: its text and the rest are
    content (the non-streamed answer is then all content).

    ``forced``: the whole answer is a JSON array of calls (``tool_choice: "required"``, held to it by the grammar).
    """

    def __init__(self, tool_names: Collection[str], style: str = "hermes", forced: bool = False) -> None:
        self.tool_names = frozenset(tool_names)
        self.tags = ("<tool_call>",) + (("<|python_tag|>",) if style == "llama3_json" else ())
        self.separators = ";" if style == "llama3_json" else ""
        self.text = ""
        self.pos = 0  # the text before it is decided (sent, or dropped as whitespace around a call)
        self.content_start = 0  # where the text since the last call began: a bare call may start there
        self.state = "open" if forced else "content"
        self.closer = ""  # what ends the current call's wrapping: "</tool_call>", "```" or nothing
        self.in_array = False
        self.scanner: _CallScanner | None = None
        self.announced = False
        self.num_sent_arguments = 0
        self.num_calls = 0
        self.failed = False

    def feed(self, text: str) -> list[ToolEvent]:
        self.text += text
        events: list[ToolEvent] = []
        while not self.failed and getattr(self, "_" + self.state)(events):
            pass
        if self.failed and self.pos < len(self.text):
            events.append(ToolEvent("content", self.text[self.pos:]))
            self.pos = len(self.text)
        return events

    def finish(self) -> list[ToolEvent]:
        """The events of what was held back; a call left open sets ``failed``."""
        if self.state == "content":
            self._send_content(events := [], len(self.text), hold_space=False)
            return events
        if self.state != "close":
            self.failed = True
        return self.feed("")

    # -- states: each reads on from pos and says whether it moved -----------------------------------------
    def _content(self, events: list[ToolEvent]) -> bool:
        start, rest = self.pos, self.text[self.pos:]
        for at in sorted({i for mark in self.tags + ("```", "{", "[") for i in _find_all(rest, mark)}):
            verdict, skip, closer = self._opener(rest[at:], self.text[self.content_start:start + at].isspace()
                                                 or self.content_start == start + at)
            if verdict == "no":
                continue
            self._send_content(events, start + at, hold_space=True)
            if verdict == "wait":
                return False
            self.pos, self.closer, self.state = start + at + skip, closer, "open"
            return True
        self._send_content(events, len(self.text) - _held_back(rest, self.tags + ("```",)), hold_space=True)
        return False

    def _opener(self, text: str, at_start: bool) -> tuple[str, int, str]:
        """("yes", its length, its closer) when ``text`` starts a call, ("wait", ...) while it may, else "no"."""
        for tag in self.tags:
            if text.startswith(tag):
                return "yes", len(tag), "</tool_call>" if tag == "<tool_call>" else ""
            if tag.startswith(text):
                return "wait", 0, ""
        fenced = "```".startswith(text[:3])
        if not fenced and not at_start:
            return "no", 0, ""
        verdict, skip = _looks_like_call(text, self.tool_names)
        return verdict, skip, "```" if fenced else ""

    def _send_content(self, events: list[ToolEvent], end: int, hold_space: bool) -> None:
        # Whitespace is held back: before a call it is dropped, before more text it goes out with it.
        text = self.text[self.pos:end]
        text = text.rstrip() if hold_space else text
        if text:
            events.append(ToolEvent("content", text))
        self.pos += len(text)

    def _open(self, events: list[ToolEvent]) -> bool:
        char = self._next_char()
        if char is None:
            return False
        if char == "[" and not self.in_array:
            self.pos += 1
            self.in_array = True
        elif char == "{":
            self.scanner, self.announced, self.num_sent_arguments, self.state = _CallScanner(), False, 0, "call"
        else:
            self.failed = True
        return True

    def _call(self, events: list[ToolEvent]) -> bool:
        scanner = self.scanner
        while self.pos < len(self.text) and not scanner.done and not scanner.error:
            scanner.feed(self.text[self.pos])
            self.pos += 1
        if not self.announced and scanner.name is not None:
            self.announced = True
            events.append(ToolEvent("call", scanner.name, self.num_calls))
        if self.announced and len(scanner.arguments) > self.num_sent_arguments:
            events.append(ToolEvent("arguments", scanner.arguments[self.num_sent_arguments:], self.num_calls))
            self.num_sent_arguments = len(scanner.arguments)
        if scanner.error or scanner.done and not scanner.is_valid():
            self.failed = True
        if self.failed or not scanner.done:
            return False
        self.num_calls += 1
        self.state = "next" if self.in_array else "close"
        return True

    def _next(self, events: list[ToolEvent]) -> bool:
        """After a call in an array: ``,`` and the next call, or ``]``."""
        char = self._next_char()
        if char is None:
            return False
        self.pos += 1
        if char == ",":
            self.state = "open"
        elif char == "]":
            self.in_array, self.state = False, "close"
        else:
            self.failed = True
        return True

    def _close(self, events: list[ToolEvent]) -> bool:
        rest = self.text[self.pos:]
        stripped = rest.lstrip(" \t\r\n" + self.separators)
        if not stripped or self.closer.startswith(stripped):
            return False  # the closer may still come
        self.pos += len(rest) - len(stripped) + (len(self.closer) if stripped.startswith(self.closer) else 0)
        self.content_start, self.state = self.pos, "content"
        return True

    def _next_char(self) -> str | None:
        """The next character that is not whitespace (pos moves to it), or None at the end of the text."""
        rest = self.text[self.pos:]
        stripped = rest.lstrip()
        self.pos += len(rest) - len(stripped)
        return stripped[0] if stripped else None


class NamedCallParser:
    """``tool_choice`` naming a function: the grammar makes the whole answer that function's arguments."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.scanner = _CallScanner()
        for char in '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": ':
            self.scanner.feed(char)
        self.num_sent_arguments = 0
        self.num_calls = 0
        self.failed = False

    def feed(self, text: str) -> list[ToolEvent]:
        events = [] if self.num_calls else [ToolEvent("call", self.name)]
        self.num_calls = 1
        for char in text:
            self.scanner.feed(char)
        if len(self.scanner.arguments) > self.num_sent_arguments:
            events.append(ToolEvent("arguments", self.scanner.arguments[self.num_sent_arguments:]))
            self.num_sent_arguments = len(self.scanner.arguments)
        return events

    def finish(self) -> list[ToolEvent]:
        events = self.feed("")
        self.scanner.feed("}")
        self.failed = not (self.scanner.done and self.scanner.is_valid())
        return events


def parse_tool_calls(parser: ToolCallParser | NamedCallParser, text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """The non-streamed answer: its content (None when empty) and its calls as (name, arguments); all content
    when a call is malformed."""
    events = parser.feed(text) + parser.finish()
    if parser.failed:
        return text, []
    content = "".join(e.text for e in events if e.kind == "content")
    calls: list[list[str]] = []
    for event in events:
        if event.kind == "call":
            calls.append([event.text, ""])
        elif event.kind == "arguments":
            calls[event.index][1] += event.text
    return content or None, [(name, arguments) for name, arguments in calls]


def _looks_like_call(text: str, tool_names: frozenset[str]) -> tuple[str, int]:
    """Whether ``text`` starts ``{"name": "<one of the tools>"`` (after an optional code fence and ``[``):
    ("yes", the fence's length), ("wait", 0) while it may, or ("no", 0)."""
    i, fence = 0, 0
    for part, optional in (("```", True), ("json", True), (None, False), ("[", True), (None, False), ("{", False),
                           (None, False), ('"name"', False), (None, False), (":", False), (None, False),
                           ('"', False)):
        if part is None:  # whitespace
            while i < len(text) and text[i].isspace():
                i += 1
            continue
        if text.startswith(part, i):
            i += len(part)
        elif part.startswith(text[i:]):
            return "wait", 0
        elif not optional:
            return "no", 0
        if part in ("```", "json"):
            fence = i if text.startswith("```") else 0
    end = text.find('"', i)
    while end > 0 and text[end - 1] == "\\":
        end = text.find('"', end + 1)
    if end < 0:
        return "wait", 0
    try:
        name = json.loads(text[i - 1:end + 1])
    except json.JSONDecodeError:
        return "no", 0
    return ("yes", fence) if name in tool_names else ("no", 0)


def _find_all(text: str, mark: str) -> list[int]:
    found, at = [], text.find(mark)
    while at >= 0:
        found.append(at)
        at = text.find(mark, at + 1)
    return found


def _held_back(text: str, marks: tuple[str, ...]) -> int:
    """The length of the longest end of ``text`` that begins one of ``marks`` (it may become one)."""
    return max((n for mark in marks for n in range(len(mark) - 1, 0, -1) if text.endswith(mark[:n])), default=0)
