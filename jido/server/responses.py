"""OpenAI response bodies and stream chunks for completions and chat, built from RequestOutputs."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from jido.core.outputs import Logprobs
from jido.engine.outputs import CompletionOutput, RequestOutput
from jido.models.tokenizer import Tokenizer
from jido.server.tool_parsers import NamedCallParser, ToolCallParser, parse_tool_calls
from jido.server.tools import ToolParserFactory, delta_of, response_tool_calls


def usage(*outputs: RequestOutput) -> dict:
    """Token counts of one request, or summed over the requests of a batched completions request."""
    num_prompt = sum(len(o.prompt_token_ids) for o in outputs)
    num_completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    return {"prompt_tokens": num_prompt, "completion_tokens": num_completion,
            "total_tokens": num_prompt + num_completion,
            "prompt_tokens_details": {"cached_tokens": sum(o.num_cached_tokens for o in outputs)}}


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

    def chunk(self, choices: list[dict], output: RequestOutput | None = None) -> dict:
        body = self.envelope(self.chunk_object_name, choices)
        if output is not None:  # the final usage-only chunk of stream_options.include_usage
            body["usage"] = usage(output)
        return body

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
    sends them in a chunk of their own before the first delta.
    """

    echo_text: str | None = None

    def response(self, output: RequestOutput) -> dict:
        body = super().response(output)
        if self.echo_text is not None:
            for choice in body["choices"]:
                choice["text"] = self.echo_text + choice["text"]
                if choice["logprobs"] is not None:
                    choice["logprobs"] = _joined(self._prompt_logprobs(output), choice["logprobs"])
        return body

    def prompt_choices(self, output: RequestOutput) -> list[dict]:
        if self.echo_text is None:
            return []
        return [{"index": c.index, "text": self.echo_text,
                 "logprobs": None if c.logprobs is None else self._prompt_logprobs(output),
                 "finish_reason": None, "stop_reason": None} for c in output.outputs]

    def choice(self, completion: CompletionOutput) -> dict:
        return self._choice(completion, completion.text, slice(0, len(completion.token_ids)))

    def delta_choice(self, completion: CompletionOutput, text: str, tokens: slice) -> dict:
        return self._choice(completion, text, tokens)

    def _choice(self, completion: CompletionOutput, text: str, tokens: slice) -> dict:
        logprobs = None if completion.logprobs is None else self._logprobs(completion.logprobs[tokens])
        return {"index": completion.index, "text": text, "logprobs": logprobs,
                "finish_reason": completion.finish_reason, "stop_reason": completion.stop_reason}

    def _logprobs(self, entries: list[Logprobs]) -> dict:
        tokens = [self.token_text(e.sampled_token_id) for e in entries]
        return {"tokens": tokens, "token_logprobs": [e.sampled_logprob for e in entries],
                "top_logprobs": [{self.token_text(t): lp for t, lp in zip(e.top_token_ids, e.top_logprobs)}
                                 for e in entries],
                "text_offset": _offsets(tokens)}

    def _prompt_logprobs(self, output: RequestOutput) -> dict:
        ids, positions = output.prompt_token_ids, output.prompt_logprobs[1:]
        tokens = [self.token_text(ids[0])] + [p[t].decoded_token for t, p in zip(ids[1:], positions)]
        return {"tokens": tokens, "token_logprobs": [None] + [p[t].logprob for t, p in zip(ids[1:], positions)],
                "top_logprobs": [None] + [{e.decoded_token: e.logprob for e in p.values()} for p in positions],
                "text_offset": _offsets(tokens)}


def _offsets(tokens: list[str]) -> list[int]:
    """Where each token's text starts in the tokens' texts laid end to end."""
    offsets, offset = [], 0
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
