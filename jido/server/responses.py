"""OpenAI response bodies and stream chunks for completions and chat, built from RequestOutputs."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from jido.core.outputs import Logprobs
from jido.engine.outputs import CompletionOutput, PromptLogprobs, RequestOutput
from jido.models.tokenizer import Tokenizer
from jido.server.tool_parsers import NamedCallParser, ToolCallParser, parse_tool_calls
from jido.server.tools import ToolParserFactory, delta_of, response_tool_calls


# vLLM's floor for a log-probability in a response: JSON has no -inf.
_MIN_LOGPROB = -9999.0


def usage(*outputs: RequestOutput) -> dict:
    """Token counts of one request, or summed over the requests of a batched completions request."""
    num_prompt = sum(len(o.prompt_token_ids) for o in outputs)
    num_completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"prompt_tokens": num_prompt, "completion_tokens": num_completion,
            "total_tokens": num_prompt + num_completion,
            "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in outputs)}}


@dataclass(frozen=True)
class StreamUsage:
    """What a request's stream chunks say of usage. With ``include_usage``, OpenAI's ``"usage": null`` on every
    chunk (the counts follow in a chunk of their own before [DONE]); with vLLM's ``continuous_usage_stats`` too,
    the counts so far on every chunk instead. Without ``include_usage`` chunks have no ``usage`` field."""

    include_usage: bool = False
    continuous: bool = False
    num_prompt_tokens: int = 0

    def stamp(self, chunk: dict, output: RequestOutput | None) -> dict:
        """``chunk`` with its ``usage``; ``output`` is the request's latest (None before the first: nothing generated)."""
        if self.include_usage and self.continuous:
            chunk["usage"] = usage(output) if output is not None else {
                "prompt_tokens": self.num_prompt_tokens, "completion_tokens": 0, "total_tokens": self.num_prompt_tokens}
        elif self.include_usage:
            chunk["usage"] = None
        return chunk


def prompt_logprobs_body(positions: PromptLogprobs) -> list[dict | None]:
    """vLLM's ``prompt_logprobs`` field: per prompt position None (the first) or ``{token id: {"logprob", "rank",
    "decoded_token"}}``, the prompt token first."""
    return [None if p is None else {str(token_id): {"logprob": max(e.logprob, _MIN_LOGPROB), "rank": e.rank,
                                                    "decoded_token": e.decoded_token} for token_id, e in p.items()}
            for p in positions]


@dataclass
class StreamCursor:
    """How much of one completion a stream has sent; text that may begin a stop string waits."""

    holdback: int
    num_chars: int = 0
    num_tokens: int = 0
    done: bool = False

    def advance(self, completion: CompletionOutput) -> tuple[str, slice] | None:
        """The next text delta and the tokens since the last one sent, or None while there is no new text.

        Tokens that added no text yet (part of a multi-byte character) go out with the next delta.
        """
        if self.done:
            return None
        self.done = completion.finish_reason is not None
        end = len(completion.text) if self.done else max(self.num_chars, len(completion.text) - self.holdback)
        if end == self.num_chars and not self.done:
            return None
        delta, tokens = completion.text[self.num_chars:end], slice(self.num_tokens, len(completion.token_ids))
        self.num_chars, self.num_tokens = end, len(completion.token_ids)
        return delta, tokens


@dataclass
class ResponseFormat:
    """What completions and chat share: ids, the envelope of bodies and chunks, and token text."""

    request_id: str
    model: str
    tokenizer: Tokenizer
    created: int = field(default_factory=lambda: int(time.time()))
    with_prompt_logprobs: bool = False  # vLLM's prompt_logprobs field was asked for
    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def envelope(self, object_name: str, choices: list[dict]) -> dict:
        return {"id": self.request_id, "object": object_name, "created": self.created, "model": self.model,
                "choices": choices}

    def response(self, output: RequestOutput) -> dict:
        body = self.envelope(self.object_name, [self.choice(c) for c in output.outputs])
        body["usage"] = usage(output)
        if output.kv_transfer_params is not None:  # a producer's handle to the request's KV (vLLM's field)
            body["kv_transfer_params"] = output.kv_transfer_params
        return body

    def prompt_choices(self, output: RequestOutput) -> list[dict]:
        """What a stream sends of the prompt before the first delta: nothing, unless echo asks."""
        return []

    def chunk(self, choices: list[dict]) -> dict:
        return self.envelope(self.chunk_object_name, choices)

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def choice(self, completion: CompletionOutput) -> dict:
        raise NotImplementedError

    def delta_choice(self, completion: CompletionOutput, text: str, tokens: slice) -> dict:
        raise NotImplementedError


@dataclass
class CompletionFormat(ResponseFormat):
    """/v1/completions: ``text`` per choice, legacy logprobs (tokens, token_logprobs, top_logprobs).

    With echo (``echo_text`` set), each choice starts with the prompt's text and its logprobs with the
    prompt tokens' (the first token's null: nothing precedes it), as vLLM and OpenAI answer; a stream
    sends them in a chunk of their own before the first delta. A stream's ``text_offset`` counts on from
    the chunks before, so the chunks' logprobs laid end to end are the unstreamed answer's.
    """

    echo_text: str | None = None
    _text_offsets: dict[int, int] = field(default_factory=dict)  # a stream's, per choice: where the next starts
    _prompt_text_len: int = 0  # a stream's: where the first generated token starts (after an echoed prompt)

    def response(self, output: RequestOutput) -> dict:
        body = super().response(output)
        for choice in body["choices"]:
            if self.echo_text is not None:
                choice["text"] = self.echo_text + choice["text"]
                if choice["logprobs"] is not None:
                    choice["logprobs"] = _joined(self._prompt_logprobs(output), choice["logprobs"])
            if self.with_prompt_logprobs:  # vLLM's, per choice on /v1/completions
                choice["prompt_logprobs"] = prompt_logprobs_body(output.prompt_logprobs)
        return body

    def prompt_choices(self, output: RequestOutput) -> list[dict]:
        if self.echo_text is None:
            return []
        logprobs = None if output.outputs[0].logprobs is None else self._prompt_logprobs(output)
        if logprobs is not None:  # the generated tokens' offsets follow the prompt's text
            self._prompt_text_len = sum(len(t) for t in logprobs["tokens"])
        return [{"index": c.index, "text": self.echo_text, "logprobs": logprobs, "finish_reason": None,
                 "stop_reason": None} for c in output.outputs]

    def choice(self, completion: CompletionOutput) -> dict:
        return self._choice(completion, completion.text, slice(0, len(completion.token_ids)))

    def delta_choice(self, completion: CompletionOutput, text: str, tokens: slice) -> dict:
        start = self._text_offsets.get(completion.index, self._prompt_text_len)
        choice = self._choice(completion, text, tokens, start)
        if choice["logprobs"] is not None:
            self._text_offsets[completion.index] = start + sum(len(t) for t in choice["logprobs"]["tokens"])
        return choice

    def _choice(self, completion: CompletionOutput, text: str, tokens: slice, text_offset: int = 0) -> dict:
        logprobs = None if completion.logprobs is None else self._logprobs(completion.logprobs[tokens], text_offset)
        return {"index": completion.index, "text": text, "logprobs": logprobs,
                "finish_reason": completion.finish_reason, "stop_reason": completion.stop_reason}

    def _logprobs(self, entries: list[Logprobs], text_offset: int = 0) -> dict:
        tokens = [self.token_text(e.sampled_token_id) for e in entries]
        return {"tokens": tokens, "token_logprobs": [e.sampled_logprob for e in entries],
                "top_logprobs": [{self.token_text(t): lp for t, lp in zip(e.top_token_ids, e.top_logprobs)}
                                 for e in entries],
                "text_offset": _offsets(tokens, text_offset)}

    def _prompt_logprobs(self, output: RequestOutput) -> dict:
        ids, positions = output.prompt_token_ids, output.prompt_logprobs[1:]
        tokens = [self.token_text(ids[0])] + [p[t].decoded_token for t, p in zip(ids[1:], positions)]
        return {"tokens": tokens, "token_logprobs": [None] + [p[t].logprob for t, p in zip(ids[1:], positions)],
                "top_logprobs": [None] + [{e.decoded_token: e.logprob for e in p.values()} for p in positions],
                "text_offset": _offsets(tokens)}


def _offsets(tokens: list[str], start: int = 0) -> list[int]:
    """Where each token's text starts in the tokens' texts laid end to end, the first at ``start``."""
    offsets, offset = [], start
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return offsets


def _joined(prompt: dict, generated: dict) -> dict:
    """The prompt's logprobs followed by the generated tokens' (their offsets after the prompt's text)."""
    shift = sum(len(t) for t in prompt["tokens"])
    return {"tokens": prompt["tokens"] + generated["tokens"],
            "token_logprobs": prompt["token_logprobs"] + generated["token_logprobs"],
            "top_logprobs": prompt["top_logprobs"] + generated["top_logprobs"],
            "text_offset": prompt["text_offset"] + [o + shift for o in generated["text_offset"]]}


@dataclass
class ChatFormat(ResponseFormat):
    """/v1/chat/completions: an assistant ``message`` per choice (``delta`` when streaming).

    With ``tool_parser`` the answer's calls come back in ``tool_calls`` (streamed as ``tool_calls`` deltas), the
    text outside them in ``content``, and ``finish_reason`` is ``tool_calls`` when the model stopped after one.
    """

    tool_parser: ToolParserFactory | None = None
    _parsers: dict[int, ToolCallParser | NamedCallParser] = field(default_factory=dict)  # a stream's, per choice
    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def response(self, output: RequestOutput) -> dict:
        body = super().response(output)
        if self.with_prompt_logprobs:  # vLLM's, once for the request on chat (its prompt is every choice's)
            body["prompt_logprobs"] = prompt_logprobs_body(output.prompt_logprobs)
        return body

    def choice(self, completion: CompletionOutput) -> dict:
        message: dict = {"role": "assistant", "content": completion.text}
        finish_reason = completion.finish_reason
        if self.tool_parser is not None:
            content, calls = parse_tool_calls(self.tool_parser(), completion.text)
            message = {**message, "content": content if calls else completion.text,
                       "tool_calls": response_tool_calls(calls)}
            finish_reason = _tool_finish_reason(finish_reason, bool(calls))
        return {"index": completion.index, "message": message,
                "logprobs": self._logprobs(completion, slice(0, len(completion.token_ids))),
                "finish_reason": finish_reason, "stop_reason": completion.stop_reason}

    def role_choice(self, index: int) -> dict:
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                "finish_reason": None}

    def delta_choice(self, completion: CompletionOutput, text: str, tokens: slice) -> dict:
        delta, finish_reason = {"content": text} if text else {}, completion.finish_reason
        if self.tool_parser is not None:
            parser = self._parsers.setdefault(completion.index, self.tool_parser())
            events = parser.feed(text) + (parser.finish() if finish_reason is not None else [])
            delta = delta_of(events)
            finish_reason = _tool_finish_reason(finish_reason, parser.num_calls > 0 and not parser.failed)
        return {"index": completion.index, "delta": delta, "logprobs": self._logprobs(completion, tokens),
                "finish_reason": finish_reason, "stop_reason": completion.stop_reason}

    def _logprobs(self, completion: CompletionOutput, tokens: slice) -> dict | None:
        if completion.logprobs is None:
            return None
        return {"content": [self._token_logprob(e.sampled_token_id, e.sampled_logprob,
                                                [self._token_logprob(t, lp) for t, lp in
                                                 zip(e.top_token_ids, e.top_logprobs)])
                            for e in completion.logprobs[tokens]]}

    def _token_logprob(self, token_id: int, logprob: float, top: list[dict] | None = None) -> dict:
        text = self.token_text(token_id)
        entry = {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}
        if top is not None:
            entry["top_logprobs"] = top
        return entry


def _tool_finish_reason(finish_reason: str | None, called: bool) -> str | None:
    # OpenAI's: "tool_calls" when the model stopped after calling; a call cut off by max_tokens stays "length".
    return "tool_calls" if called and finish_reason == "stop" else finish_reason
