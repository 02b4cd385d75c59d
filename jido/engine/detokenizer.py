"""IncrementalDetokenizer: turns a growing list of token ids into text, and finds stop strings in it."""
from __future__ import annotations

from typing import Protocol

from jido.core.sampling_params import SamplingParams

# How many prompt tokens to decode in front of the output: enough context that a SentencePiece
# tokenizer decodes the first output token's leading space (or lack of it) as it would in place.
_PROMPT_CONTEXT_TOKENS = 5


def stop_string_holdback(params: SamplingParams) -> int:
    """How many trailing characters a stream should hold back: they may begin a stop string."""
    return max((len(s) for s in params.stop_strings), default=1) - 1


class TextDecoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Decodes one request's output text token by token.

    Each step decodes a short window twice (``prefix_offset:read_offset`` and ``prefix_offset:``) and
    emits the difference, so multi-byte characters split over byte-fallback tokens appear only once
    complete (a trailing U+FFFD means "wait for more bytes").
    """

    def __init__(self, tokenizer: TextDecoder, prompt_token_ids: list[int], params: SamplingParams) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = params.skip_special_tokens
        self.stop_strings = params.stop_strings
        self.include_stop = params.include_stop_str_in_output
        context = prompt_token_ids[-_PROMPT_CONTEXT_TOKENS:]
        self.token_ids = list(context)
        self.prefix_offset = 0
        self.read_offset = len(context)
        self.text = ""

    def update(self, new_token_ids: list[int]) -> tuple[str | None, int]:
        """Decode new tokens one by one, looking for stop strings after each.

        Returns the stop string that matched, if one did (the text is cut there), and how many of the new
        tokens belong to the output: all of them, or those up to the one that completed the stop string.
        """
        for num_used, token_id in enumerate(new_token_ids, start=1):
            start = len(self.text)
            self.token_ids.append(token_id)
            self.text += self._next_delta()
            stop = self._find_stop(start)
            if stop is not None:
                return stop, num_used
        return None, len(new_token_ids)

    def _next_delta(self) -> str:
        decode = self.tokenizer.decode
        before = decode(self.token_ids[self.prefix_offset:self.read_offset], self.skip_special_tokens)
        after = decode(self.token_ids[self.prefix_offset:], self.skip_special_tokens)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        return after[len(before):]

    def _find_stop(self, start: int) -> str | None:
        matches = []
        for stop in self.stop_strings:
            # A stop string may have begun in text emitted by an earlier step.
            index = self.text.find(stop, max(0, start - len(stop) + 1))
            if index >= 0:
                matches.append((index, stop))
        if not matches:
            return None
        index, stop = min(matches)
        self.text = self.text[:index + len(stop)] if self.include_stop else self.text[:index]
        return stop
