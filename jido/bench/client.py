"""One streamed OpenAI-style request: send it, read its server-sent events, time every token chunk."""
from __future__ import annotations

import codecs
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from jido.bench.config import BenchConfig
from jido.bench.datasets import SampleRequest

_ERROR_CHARS = 500
# Sends after the first when the server closed the connection before answering. A pool of kept-alive
# connections can hold several the server has already closed, so one retry is not always enough.
MAX_RETRIES = 3


@dataclass
class RequestOutcome:
    """What one request measured; times are seconds from perf_counter."""

    prompt_len: int
    output_len: int = 0
    success: bool = False
    start: float = 0.0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    error: str = ""
    num_retries: int = 0  # sends repeated because the connection closed before any byte of the answer


class SSEDecoder:
    """Splits a byte stream into server-sent-event data payloads, whatever the network's chunking."""

    def __init__(self) -> None:
        self._buffer = ""
        # Incremental: a multi-byte character may be split across two network chunks.
        self._utf8 = codecs.getincrementaldecoder("utf-8")()

    def feed(self, chunk: bytes) -> Iterator[str]:
        """The data of every event completed by `chunk` (multi-line data joined by newlines)."""
        self._buffer = (self._buffer + self._utf8.decode(chunk)).replace("\r\n", "\n")
        *events, self._buffer = self._buffer.split("\n\n")
        for event in events:
            data = [line[5:].removeprefix(" ") for line in event.split("\n") if line.startswith("data:")]
            if data:
                yield "\n".join(data)


def build_payload(config: BenchConfig, model: str, request: SampleRequest) -> dict[str, Any]:
    payload: dict[str, Any] = {"model": model, "max_tokens": request.output_len, "temperature": config.temperature,
                               "stream": True, "stream_options": {"include_usage": True}}
    if config.is_chat:
        payload["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        payload["prompt"] = request.prompt
    if config.ignore_eos:
        payload["ignore_eos"] = True  # vLLM and llama.cpp both read this extension
    return payload


async def send_request(session: aiohttp.ClientSession, url: str, payload: dict[str, Any],
                       prompt_len: int) -> RequestOutcome:
    """POST a streaming request; never raises for server or network errors, which land in `error`."""
    outcome = RequestOutcome(prompt_len=prompt_len, start=time.perf_counter())
    try:
        response = await _post(session, url, payload, outcome)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return _failed(outcome, exc)
    async with response:
        try:
            await _read_response(response, outcome)
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError, ValueError) as exc:
            _failed(outcome, exc)
    return outcome


async def _post(session: aiohttp.ClientSession, url: str, payload: dict[str, Any],
                outcome: RequestOutcome) -> aiohttp.ClientResponse:
    """POST, sending again (up to MAX_RETRIES times, counted in the outcome) when the connection breaks first.

    A server may close a kept-alive connection just as the client reuses it (llama-server's cpp-httplib does
    under load): the write fails ("Can not write request body") or the server hangs up before the status
    line. No byte of the answer came back, so nothing was generated for the client and sending again is
    safe. A refused connection is not retried: the server is not there.
    """
    for _ in range(MAX_RETRIES):
        try:
            return await session.post(url, json=payload)
        except aiohttp.ClientConnectorError:
            raise
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            outcome.num_retries += 1
    return await session.post(url, json=payload)


def _failed(outcome: RequestOutcome, exc: BaseException) -> RequestOutcome:
    retried = f" (after {outcome.num_retries} retries)" if outcome.num_retries else ""
    outcome.success, outcome.error = False, f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS] + retried
    return outcome


async def _read_response(response: aiohttp.ClientResponse, outcome: RequestOutcome) -> None:
    if response.status != 200:
        outcome.error = f"HTTP {response.status}: {(await response.text())[:_ERROR_CHARS]}"
        return
    await _read_stream(response, outcome)


async def _read_stream(response: aiohttp.ClientResponse, outcome: RequestOutcome) -> None:
    decoder, last, num_chunks = SSEDecoder(), outcome.start, 0
    async for chunk in response.content.iter_any():
        now = time.perf_counter()
        for data in decoder.feed(chunk):
            if data.strip() == "[DONE]":
                continue
            event = json.loads(data)
            if "error" in event:
                raise ValueError(f"server error in stream: {json.dumps(event['error'])[:_ERROR_CHARS]}")
            if _chunk_text(event):
                # NOTE: a chunk may carry several tokens; like vLLM's bench, ITL is measured per chunk.
                if num_chunks == 0:
                    outcome.ttft = now - outcome.start
                else:
                    outcome.itl.append(now - last)
                last, num_chunks = now, num_chunks + 1
            usage = event.get("usage") or {}
            outcome.output_len = usage.get("completion_tokens") or outcome.output_len
            outcome.prompt_len = usage.get("prompt_tokens") or outcome.prompt_len
    outcome.output_len = outcome.output_len or num_chunks
    outcome.latency = last - outcome.start
    outcome.success = num_chunks > 0
    outcome.error = "" if outcome.success else "the stream ended without any generated text"


def _chunk_text(event: dict[str, Any]) -> str:
    choices = event.get("choices") or [{}]
    delta = choices[0].get("delta") or {}
    return choices[0].get("text") or delta.get("content") or delta.get("reasoning_content") or ""
