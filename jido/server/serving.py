"""OpenAIServing: turns completion and chat requests into engine requests and their outputs into responses."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from jido.core.sampling_params import SamplingParams
from jido.engine.async_engine import AsyncEngine, EngineOverloadedError, EngineStoppedError, RequestStream
from jido.engine.chat_template import NO_TEMPLATE, ChatTemplate
from jido.engine.detokenizer import stop_string_holdback
from jido.engine.llm_engine import ProcessedPrompt
from jido.engine.outputs import RequestOutput
from jido.server.errors import APIError, bad_request, from_validation_error, parse_json
from jido.server.metrics import RequestTimer, ServerMetrics
from jido.server.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest,
                                  check_supported)
from jido.server.responses import ChatFormat, CompletionFormat, ResponseFormat, StreamCursor, StreamUsage, usage
from jido.server.tools import parser_factory

_RETRY_AFTER_S = "1"
# Prompts with more UTF-8 bytes than max_model_len times this are refused before tokenizing: real text
# averages about 4 bytes a token, so such a prompt cannot fit, and tokenizing it costs seconds.
PROMPT_BYTES_PER_TOKEN = 32
_Body = TypeVar("_Body", bound=BaseModel)


class OpenAIServing:
    """The /v1 endpoints over one AsyncEngine and the model it serves."""

    def __init__(self, engine: AsyncEngine, model_name: str, chat_template: ChatTemplate | None,
                 metrics: ServerMetrics, tool_call_parser: str | None = None) -> None:
        """``tool_call_parser``: how ``tool_choice: "auto"`` answers are read (None: their calls stay text)."""
        self.engine = engine
        self.tool_call_parser = tool_call_parser
        self.model_name = model_name
        self.chat_template = chat_template
        self.metrics = metrics
        self.llm = engine.engine
        self.max_prompt_bytes = self.llm.max_model_len * PROMPT_BYTES_PER_TOKEN
        self.created = int(time.time())  # the model objects' "created": when this server started serving it

    def models(self) -> dict:
        return {"object": "list", "data": [self.model(self.model_name)]}

    def model(self, model_id: str) -> dict:
        """GET /v1/models/{id}: the model object; OpenAI's 404 (model_not_found) for a model not served here."""
        self.check_model(model_id)
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "jido",
                "max_model_len": self.llm.max_model_len}

    def tokenizer_info(self) -> dict:
        """vLLM's GET /tokenizer_info: the tokenizer's settings (see ``Tokenizer.info``) with the chat template
        served; lm-evaluation-harness's ``remote`` tokenizer reads its special tokens and template."""
        info = self.llm.tokenizer.info()
        if self.chat_template is not None:
            info["chat_template"] = self.chat_template.source
        return info

    async def completions(self, http_request: Request) -> Response:
        timer = RequestTimer()
        body = validate_body(CompletionRequest, parse_json(await http_request.body()))
        self.check_model(body.model)
        prompts = _batch_of_prompts(body.prompt)
        # Tokenized on a worker thread: a long prompt must not stall the event loop (every stream, /health).
        prepared = await asyncio.to_thread(self._batch_prompts, prompts, body.kv_blend)
        prompt_ids = [p.token_ids for p in prepared]
        params = [_in_batch(i, len(prompts), self._params, body, ids, body.max_tokens, body.logprobs,
                            body.num_prompt_logprobs) for i, ids in enumerate(prompt_ids)]
        if body.kv_transfer_params is not None and len(prompts) > 1:
            raise bad_request("kv_transfer_params names one request's KV: send one prompt with it", "kv_transfer_params")
        self._check_transfer(body, params[0])
        # Off the event loop: the first constrained request builds the vocabulary's token trie (seconds).
        await asyncio.to_thread(self._check_grammar, body, params[0])
        request_id = f"cmpl-{uuid.uuid4().hex}"
        fmts = [CompletionFormat(request_id, self.model_name, self.llm.tokenizer,
                                 with_prompt_logprobs=body.prompt_logprobs is not None,
                                 echo_text=self._echo_text(p if body.kv_blend is None else ids, ids)
                                 if body.echo else None)
                for p, ids in zip(prompts, prompt_ids)]
        if len(prompts) == 1:
            return await self._respond(http_request, fmts[0], prepared[0], params[0], body, timer)
        return await self._respond_batch(http_request, fmts, prepared, params, body, timer)

    async def chat(self, http_request: Request) -> Response:
        timer = RequestTimer()
        body = validate_body(ChatCompletionRequest, parse_json(await http_request.body()))
        self.check_model(body.model)
        if self.chat_template is None:
            raise bad_request(NO_TEMPLATE)
        if not body.messages:
            raise bad_request("messages is empty: give at least one message", "messages")
        prompt_ids = await asyncio.to_thread(self._chat_prompt_ids, body)  # off the event loop, as above
        params = self._params(body, prompt_ids, body.requested_max_tokens, body.num_logprobs, body.prompt_logprobs)
        self._check_transfer(body, params)
        await asyncio.to_thread(self._check_grammar, body, params)
        fmt = ChatFormat(f"chatcmpl-{uuid.uuid4().hex}", self.model_name, self.llm.tokenizer,
                         with_prompt_logprobs=body.prompt_logprobs is not None, tool_parser=parser_factory(body.tools, body.effective_tool_choice, self.tool_call_parser))
        return await self._respond(http_request, fmt, ProcessedPrompt(None, prompt_ids), params, body, timer)

    async def tokenize(self, http_request: Request) -> Response:
        """vLLM's /tokenize: ``{"tokens", "count", "max_model_len", "token_strs"}``."""
        body = validate_body(TokenizeRequest, parse_json(await http_request.body()))
        self.check_model(body.model)
        tokenizer = self.llm.tokenizer
        try:
            ids = await asyncio.to_thread(tokenizer.encode, body.prompt, body.add_special_tokens)
        except ValueError as exc:  # text that is not valid Unicode
            raise bad_request(str(exc), "prompt") from exc
        strs = tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": self.llm.max_model_len,
                             "token_strs": strs})

    async def detokenize(self, http_request: Request) -> Response:
        """vLLM's /detokenize: ``{"prompt"}``, the text of the ids with special tokens kept."""
        body = validate_body(DetokenizeRequest, parse_json(await http_request.body()))
        self.check_model(body.model)
        vocab_size = self.llm.tokenizer.vocab_size
        bad = next((i for i, t in enumerate(body.tokens) if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise bad_request(f"tokens[{bad}] = {body.tokens[bad]} is outside the vocabulary: ids must be in "
                              f"[0, {vocab_size})", "tokens")
        text = await asyncio.to_thread(self.llm.tokenizer.decode, body.tokens, False)
        return JSONResponse({"prompt": text})

    # -- request checks ---------------------------------------------------------------------------
    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.model_name:
            raise APIError(404, f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                           param="model", code="model_not_found")

    def _batch_prompts(self, prompts: list[object], kv_blend: dict | None) -> list[ProcessedPrompt]:
        if kv_blend is not None:
            if len(prompts) > 1:
                raise bad_request("kv_blend gives one prompt's chunks: send one prompt (the question) with it",
                                  "kv_blend")
            return [self._prepared({"prompt": prompts[0], "kv_blend": kv_blend}, "kv_blend")]
        return [_in_batch(i, len(prompts), self.completion_prompt, p) for i, p in enumerate(prompts)]

    def _check_transfer(self, body: CompletionRequest | ChatCompletionRequest, params: SamplingParams) -> None:
        try:
            self.llm.check_transfer_params(body.kv_transfer_params, params)
        except ValueError as exc:
            raise bad_request(str(exc), "kv_transfer_params") from exc

    def _check_grammar(self, body: CompletionRequest | ChatCompletionRequest, params: SamplingParams) -> None:
        """A 400 naming the field when the request's constraint does not compile (or cannot be enforced here)."""
        try:
            self.llm.compile_grammar(params)
        except ValueError as exc:
            field, message = body.constraint_field, str(exc)
            if field == "tools":  # a forced call's schema: the tools' parameters
                message = message.replace("structured_outputs.json", "tools[].function.parameters", 1)
            elif field != "structured_outputs":
                message = message.replace("structured_outputs.json", "response_format.json_schema.schema", 1)
                message = message.replace("structured_outputs", "response_format", 1)
            raise bad_request(message, field.split(".")[0]) from exc

    def kv_transfer(self) -> dict:
        """GET /kv_transfer: this instance's KV role, endpoint and format, for routers (404 without a connector)."""
        info = self.llm.kv_connector_info
        if "address" not in info:
            raise APIError(404, "this server has no --kv-transfer-config", code="not_found")
        return info

    def completion_prompt_ids(self, prompt: object) -> list[int]:
        return self.completion_prompt(prompt).token_ids

    def completion_prompt(self, prompt: object) -> ProcessedPrompt:
        """A completions prompt checked and tokenized (a text with the kv_blend separator becomes a blend)."""
        if isinstance(prompt, str):
            self._check_prompt_bytes(_utf8_len(prompt), "prompt")
        return self._prepared(prompt)

    def _echo_text(self, prompt: object, prompt_ids: list[int]) -> str:
        # Token ids are echoed as their text, special tokens included (as vLLM decodes them).
        return prompt if isinstance(prompt, str) else self.llm.tokenizer.decode(prompt_ids, skip_special_tokens=False)

    def _chat_prompt_ids(self, body: ChatCompletionRequest) -> list[int]:
        try:
            messages = body.template_messages()
            self._check_prompt_bytes(sum(_utf8_len(m["content"]) for m in messages), "messages")
            text = self.chat_template.render(messages, body.add_generation_prompt, body.tools,
                                             body.chat_template_kwargs)
        except ValueError as exc:
            raise bad_request(str(exc), "messages") from exc
        # The template already wrote the special tokens (BOS), as transformers' apply_chat_template does.
        return self._prompt_ids(self.llm.tokenizer.encode(text, add_special_tokens=False))

    def _check_prompt_bytes(self, num_bytes: int, param: str) -> None:
        if num_bytes > self.max_prompt_bytes:
            raise bad_request(f"{param} has {num_bytes} bytes of text; at most {self.max_prompt_bytes} are "
                              f"taken (max_model_len {self.llm.max_model_len} tokens times "
                              f"{PROMPT_BYTES_PER_TOKEN} bytes), and no prompt that long fits", param)

    def _prompt_ids(self, prompt: object) -> list[int]:
        return self._prepared(prompt).token_ids

    def _prepared(self, prompt: object, param: str = "prompt") -> ProcessedPrompt:
        try:
            return self.llm.prepare_prompt(prompt)
        except ValueError as exc:
            raise bad_request(str(exc), param) from exc

    def _params(self, body: CompletionRequest | ChatCompletionRequest, prompt_ids: list[int],
                max_tokens: int | None, logprobs: int | None, prompt_logprobs: int | None = None) -> SamplingParams:
        room = self.llm.max_model_len - len(prompt_ids)
        if max_tokens is not None and max_tokens > room:
            name = body.client_name("max_tokens")
            raise bad_request(f"{name}={max_tokens} is too large: the prompt has {len(prompt_ids)} tokens "
                              f"and max_model_len is {self.llm.max_model_len}, so at most {room} tokens "
                              "can be generated", name)
        max_n = self.llm.config.scheduler_config.max_num_seqs
        if isinstance(body.n, int) and body.n > max_n:
            raise bad_request(f"n={body.n} is too large: at most {max_n} (the engine's max_num_seqs)", "n")
        try:
            return body.sampling_params(room if max_tokens is None else max_tokens, logprobs, prompt_logprobs)
        except ValueError as exc:
            # SamplingParams' messages start with the field's name ("temperature must be >= 0, ..."),
            # said here as the client said it (chat's top_logprobs sets logprobs).
            name, rest = str(exc).split(" ", 1)
            param = body.client_name(name)
            field = param.split(".")[0]  # response_format.type: the field is response_format
            raise bad_request(f"{param} {rest}", field if field in type(body).model_fields else None) from exc

    # -- running ----------------------------------------------------------------------------------
    async def _respond(self, http_request: Request, fmt: ResponseFormat, prompt: ProcessedPrompt,
                       params: SamplingParams, body: CompletionRequest | ChatCompletionRequest,
                       timer: RequestTimer) -> Response:
        outputs = self.submit(fmt.request_id, prompt, params, timer, body.priority,
                              kv_transfer_params=body.kv_transfer_params)
        if body.stream:
            chunks = _numbered(self._chunks(outputs, fmt, params, timer, _stream_usage(body, prompt.token_ids)), 0)
            return StreamingResponse(self._sse(chunks, body.include_usage), media_type="text/event-stream")
        final = await self._collect(http_request, self._last(outputs, timer))
        return JSONResponse(fmt.response(final))

    async def _respond_batch(self, http_request: Request, fmts: list[CompletionFormat], prompts: list[ProcessedPrompt],
                             params: list[SamplingParams], body: CompletionRequest, timer: RequestTimer) -> Response:
        """Several prompts in one completions request, as vLLM serves them: one engine request each, and
        choice ``index`` ``i * n + j`` for completion ``j`` of prompt ``i``; usage sums them all."""
        n = params[0].n
        self._check_batch_room(len(prompts), n)
        timers = [timer] + [RequestTimer(timer.arrival) for _ in fmts[1:]]
        streams: list[RequestStream] = []
        try:
            for i, (prompt, p, t) in enumerate(zip(prompts, params, timers)):
                streams.append(self.submit(f"{fmts[i].request_id}-{i}", prompt, p, t, body.priority))
        except APIError:
            for submitted in streams:
                submitted.close()  # aborts the prompts already queued
            raise
        if body.stream:
            chunks = [_offset_choices(self._chunks(s, f, p, t, _stream_usage(body, prompt.token_ids)), i * n)
                      for i, (s, f, p, t, prompt) in enumerate(zip(streams, fmts, params, timers, prompts))]
            return StreamingResponse(self._sse(_merged(chunks), body.include_usage), media_type="text/event-stream")
        finals = await self._collect(http_request, asyncio.gather(*(self._last(s, t) for s, t in zip(streams, timers))))
        bodies = [f.response(out) for f, out in zip(fmts, finals)]
        for i, response in enumerate(bodies):
            for choice in response["choices"]:
                choice["index"] += i * n
        merged = fmts[0].envelope(fmts[0].object_name, [c for b in bodies for c in b["choices"]])
        merged["usage"] = usage(*finals)
        return JSONResponse(merged)

    def _check_batch_room(self, num_prompts: int, n: int) -> None:
        """A 400 for a batch that can never be admitted (more sequences than the engine ever holds at once: a
        retry could not help), else a 503 while there is no room for all of it now."""
        num_seqs, limit = num_prompts * n, self.engine.max_num_unfinished
        if num_seqs > limit:
            raise bad_request(f"{num_prompts} prompts with n={n} are {num_seqs} sequences; this server holds at most "
                              f"{limit} at once (max_num_seqs running plus max_waiting_requests waiting): send fewer "
                              "prompts or a smaller n", "prompt" if n == 1 else "n")
        try:
            self.engine.check_room(num_seqs)
        except EngineOverloadedError as exc:
            raise self._overloaded(exc) from exc

    def _overloaded(self, exc: EngineOverloadedError) -> APIError:
        self.metrics.on_rejected("overload")
        return APIError(503, str(exc), "service_unavailable", code="overloaded",
                        headers={"Retry-After": _RETRY_AFTER_S})

    def submit(self, request_id: str, prompt: ProcessedPrompt | list[int], params: SamplingParams,
               timer: RequestTimer, priority: int = 0, pin: bool = False,
               kv_transfer_params: dict | None = None) -> RequestStream:
        """Queue a request (``pin``: a prefix to pin, see /v1/cache); overload and drain are 503s."""
        if not isinstance(prompt, ProcessedPrompt):
            prompt = ProcessedPrompt(None, prompt)
        try:
            # Validated and tokenized once, in _prepared: the engine takes the ids as they are.
            return self.engine.add_request(request_id, prompt, params, timer.arrival, priority, pin,
                                           kv_transfer_params)
        except EngineOverloadedError as exc:
            raise self._overloaded(exc) from exc
        except EngineStoppedError as exc:
            self.metrics.on_rejected("stopped")
            raise APIError(503, str(exc), "service_unavailable", code="unavailable",
                           headers={"Retry-After": _RETRY_AFTER_S}) from exc

    async def _outputs(self, outputs: RequestStream, timer: RequestTimer) -> AsyncIterator[RequestOutput]:
        """The stream's outputs, recorded in the metrics; aborts the request if left early."""
        with outputs:
            try:
                async for output in outputs:
                    self.metrics.on_output(timer, output)
                    yield output
            finally:
                if not outputs.finished:
                    self.metrics.on_aborted(outputs.num_seqs)

    async def _collect(self, http_request: Request, results: Awaitable[_Result]) -> _Result:
        """What ``results`` gives (the final outputs); abandons the requests if the client hangs up first."""
        collect = asyncio.ensure_future(results)
        hang_up = asyncio.ensure_future(_disconnected(http_request))
        try:
            await asyncio.wait((collect, hang_up), return_when=asyncio.FIRST_COMPLETED)
        finally:
            hang_up.cancel()
            if not collect.done():
                collect.cancel()
        if not collect.done() or collect.cancelled():
            raise APIError(499, "client closed the request", code="client_closed")
        return _engine_result(collect)

    async def _last(self, outputs: RequestStream, timer: RequestTimer) -> RequestOutput:
        final = None
        async with aclosing(self._outputs(outputs, timer)) as stream:
            async for final in stream:
                pass
        return final

    async def _chunks(self, outputs: RequestStream, fmt: ResponseFormat, params: SamplingParams,
                      timer: RequestTimer, stream_usage: StreamUsage) -> AsyncIterator[_Chunk]:
        """One request's stream chunks, each with the request's latest output (None before the first)."""
        cursors = [StreamCursor(stop_string_holdback(params)) for _ in range(params.n)]
        if isinstance(fmt, ChatFormat):
            yield stream_usage.stamp(fmt.chunk([fmt.role_choice(i) for i in range(params.n)]), None), None
        output_is_first = True
        async with aclosing(self._outputs(outputs, timer)) as stream:
            async for output in stream:
                if output_is_first and (prompt_choices := fmt.prompt_choices(output)):
                    # echo: the prompt, before the first delta
                    yield stream_usage.stamp(fmt.chunk(prompt_choices), output), output
                output_is_first = False
                choices = [fmt.delta_choice(c, *step) for c, cursor in zip(output.outputs, cursors)
                           if (step := cursor.advance(c)) is not None]
                yield (stream_usage.stamp(fmt.chunk(choices), output) if choices else None), output

    async def _sse(self, chunks: AsyncIterator[_NumberedChunk], include_usage: bool) -> AsyncIterator[str]:
        """Server-sent events of the chunks of one or more requests (numbered); an engine error ends the
        stream with an error event, then [DONE]."""
        last: dict[int, RequestOutput] = {}  # each request's latest output, for the usage chunk
        envelope = None
        try:
            async with aclosing(chunks) as stream:
                async for chunk, output, number in stream:
                    if output is not None:
                        last[number] = output
                    if chunk is not None:
                        envelope = envelope or chunk
                        yield _event(chunk)
        except (ValueError, EngineStoppedError) as exc:
            yield _event(_engine_error(exc).body())
        if include_usage and last and envelope is not None:
            yield _event({**envelope, "choices": [], "usage": usage(*last.values())})
        yield "data: [DONE]\n\n"


_Result = TypeVar("_Result")
_Chunk = tuple[dict | None, RequestOutput | None]  # a stream chunk (None: nothing to send), the latest output
_NumberedChunk = tuple[dict | None, RequestOutput | None, int]  # ... and which request of a batch it is from


def _stream_usage(body: CompletionRequest | ChatCompletionRequest, prompt_ids: list[int]) -> StreamUsage:
    return StreamUsage(body.include_usage, body.continuous_usage_stats, len(prompt_ids))


def _batch_of_prompts(prompt: object) -> list[object]:
    """The prompts of a completions request: a list of texts or of token-id lists is a batch, else one prompt."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        return list(prompt)
    return [prompt]


def _in_batch(index: int, batch_size: int, check: Callable[..., _Result], *args: object) -> _Result:
    """``check(*args)`` for prompt ``index`` of a batch; its 400 then says which prompt (``prompt[1]: ...``)."""
    try:
        return check(*args)
    except APIError as exc:
        if batch_size > 1 and exc.status == 400:
            exc.message = f"prompt[{index}]: {exc.message}"
        raise


async def _offset_choices(chunks: AsyncIterator[_Chunk], offset: int) -> AsyncIterator[_Chunk]:
    """A batch member's chunks with its choices numbered after the earlier prompts' (``i * n + j``)."""
    async with aclosing(chunks) as stream:
        async for chunk, output in stream:
            if chunk is not None:
                chunk = {**chunk, "choices": [{**c, "index": c["index"] + offset} for c in chunk["choices"]]}
            yield chunk, output


async def _numbered(chunks: AsyncIterator[_Chunk], number: int) -> AsyncIterator[_NumberedChunk]:
    async with aclosing(chunks) as stream:
        async for chunk, output in stream:
            yield chunk, output, number


async def _merged(streams: list[AsyncIterator[_Chunk]]) -> AsyncIterator[_NumberedChunk]:
    """Chunks of every stream as they come, each numbered by its stream; the first error ends them all."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(number: int, stream: AsyncIterator[_Chunk]) -> None:
        try:
            async for item in _numbered(stream, number):
                await queue.put(item)
            await queue.put(done)
        except Exception as exc:  # handed to the consumer, which raises it
            await queue.put(exc)

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()  # a stream left early aborts its request (RequestStream's context)
        await asyncio.gather(*tasks, return_exceptions=True)


def validate_body(model: type[_Body], data: dict) -> _Body:
    unsupported = check_supported(data, model.model_fields)
    if unsupported is not None:
        raise bad_request(unsupported[1], unsupported[0])
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise from_validation_error(exc) from exc


def _utf8_len(text: str) -> int:
    # surrogatepass: a lone surrogate is reported later, by the tokenizer's own check, with its position.
    return len(text.encode("utf-8", "surrogatepass"))


async def _disconnected(http_request: Request) -> None:
    # The body is read, so the next ASGI message is the client going away.
    while (await http_request.receive())["type"] != "http.disconnect":
        pass


def _engine_result(collect: asyncio.Future) -> RequestOutput:
    try:
        return collect.result()
    except (ValueError, EngineStoppedError) as exc:
        raise _engine_error(exc) from exc


def _engine_error(exc: Exception) -> APIError:
    if isinstance(exc, ValueError):
        return bad_request(str(exc))
    return APIError(503, str(exc), "service_unavailable", code="unavailable")


def _event(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"
