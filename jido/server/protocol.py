"""The OpenAI request bodies jido accepts (with vLLM's sampling extras), as pydantic models."""
from __future__ import annotations

import json
from collections.abc import Callable, Collection
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, PlainValidator, ValidationInfo
from pydantic_core import PydanticCustomError

from jido.core.sampling_params import SamplingParams, StructuredOutputsParams
from jido.engine.chat_template import RESERVED_TEMPLATE_VARIABLES
from jido.models.tokenizer import check_encodable
from jido.server.tools import check_tool_choice, forced_call_schema, template_messages_tool_calls

# Fields passed to SamplingParams unchanged when the client sets them.
_SAMPLING_FIELDS = ("n", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                    "frequency_penalty", "seed", "stop", "stop_token_ids", "ignore_eos", "min_tokens",
                    "include_stop_str_in_output", "skip_special_tokens")


_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
               type(None): "null"}
_MAX_TOP_LOGPROBS = 20  # OpenAI's bound, and SamplingParams' for logprobs


def _tool_choice_is_noop(value: Any, body: dict) -> bool:
    # Completions have no tools: "none" asks for nothing (chat declares tool_choice and checks it itself).
    return value is None or value == "none"


# Fields jido cannot honour, with what they would ask for and the values that ask for nothing (accepted as
# no-ops, as clients often send the defaults). Any other value gets a 400 naming the field: silently doing
# something else than asked is worse than refusing. Unknown fields not listed here (user, ...) are ignored.
# A body that declares one of them (completions' echo) serves it, and the check skips it there.
_UNSUPPORTED: dict[str, tuple[str, Callable[[Any, dict], bool]]] = {
    "best_of": ("server-side best-of sampling (best_of above n)",
                lambda v, body: v is None or (type(v) is int and v == body.get("n", 1))),
    "echo": ("echoing the prompt in chat", lambda v, body: v is None or v is False),
    "suffix": ("text after the completion (fill-in-the-middle)", lambda v, body: v is None or v == ""),
    "logit_bias": ("logit biases", lambda v, body: v is None or v == {}),
    "tool_choice": ("tool calls on /v1/completions (send tools to /v1/chat/completions)", _tool_choice_is_noop),
    "functions": ("function calling", lambda v, body: v is None or v == []),
    "function_call": ("function calling", lambda v, body: v is None or v == "none"),
}


def check_supported(data: dict, declared: Collection[str] = ()) -> tuple[str, str] | None:
    """The first field of ``data`` jido cannot honour, with an error message; None when all can be.

    ``declared`` are the fields of the body ``data`` is for: those it validates itself.
    """
    for name, (feature, is_noop) in _UNSUPPORTED.items():
        if name in data and name not in declared and not is_noop(data[name], data):
            return name, f"{name} is not supported: jido does not serve {feature}; leave it out"
    return None


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)


def _is_list_of(value: object, kind: type) -> bool:
    # bool is an int to isinstance, never to JSON.
    return isinstance(value, list) and all(isinstance(v, kind) and not isinstance(v, bool) for v in value)


def _one_of(allowed: str, ok: Callable[[Any], bool]) -> PlainValidator:
    """A validator for a field of several JSON shapes: the value if ``ok``, else an error saying ``allowed``."""
    def validate(value: Any) -> Any:
        if ok(value):
            return value
        got = _json_type(value)
        if isinstance(value, list):
            got = "an array holding " + ", ".join(sorted({_json_type(v) for v in value}))
        raise PydanticCustomError("invalid_type", "must be {allowed}, got {got}", {"allowed": allowed, "got": got})
    return PlainValidator(validate)


# The shapes of vLLM's completion prompt; a list of more than one prompt is refused by the server.
Prompt = Annotated[str | list[int] | list[str] | list[list[int]], _one_of(
    "a string, an array of token ids, or an array of one of those",
    lambda v: isinstance(v, str) or _is_list_of(v, int) or _is_list_of(v, str)
    or (isinstance(v, list) and all(_is_list_of(p, int) for p in v)))]
Stop = Annotated[str | list[str] | None, _one_of(
    "a string or an array of strings", lambda v: v is None or isinstance(v, str) or _is_list_of(v, str))]
# Parts are checked when the messages are rendered, which says which part types jido serves.
Content = Annotated[str | list[dict[str, Any]] | None, _one_of(
    "a string or an array of content parts", lambda v: v is None or isinstance(v, str) or _is_list_of(v, dict))]


def _invalid(message: str) -> PydanticCustomError:
    return PydanticCustomError("invalid_value", "{message}", {"message": message})


def _check_top_logprobs(value: int | None, info: ValidationInfo) -> int | None:
    # Checked whether or not logprobs is set, as OpenAI does (vLLM: top_logprobs needs logprobs too).
    if value is not None and not 0 <= value <= _MAX_TOP_LOGPROBS:
        raise _invalid(f"top_logprobs must be an integer in [0, {_MAX_TOP_LOGPROBS}], got {value}")
    if value and not info.data.get("logprobs"):
        raise _invalid("top_logprobs needs logprobs: true (it is the number of alternatives to return with them)")
    return value


def _check_prompt_logprobs(value: int | None, info: ValidationInfo) -> int | None:
    # vLLM's rule: a stream has no place for them (0 asks for none, so it is let through, as vLLM does).
    if value and info.data.get("stream"):
        raise _invalid("prompt_logprobs are not available with stream: true; ask without streaming")
    return value


def _check_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """OpenAI's tools, as vLLM takes them: ``{"type": "function", "function": {"name", "description"?,
    "parameters"?}}`` (``type`` may be left out); anything else would be rendered into the prompt as it came."""
    for i, tool in enumerate(tools or ()):
        if tool.get("type", "function") != "function":
            raise _invalid(f'tools[{i}].type must be "function", got {json.dumps(tool["type"])}')
        function = tool.get("function")
        if not isinstance(function, dict):
            raise _invalid(f"tools[{i}].function must be an object with the function's name, got "
                           f"{'nothing' if function is None else _json_type(function)}")
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise _invalid(f"tools[{i}].function.name must be a non-empty string")
        for key, kind in (("description", str), ("parameters", dict)):
            if function.get(key) is not None and not isinstance(function[key], kind):
                raise _invalid(f"tools[{i}].function.{key} must be a JSON {_JSON_TYPES[kind]}, got "
                               f"{_json_type(function[key])}")
    return tools


def _check_tool_choice(value: str | dict[str, Any] | None, info: ValidationInfo) -> str | dict[str, Any] | None:
    if value is not None:
        try:
            check_tool_choice(value, info.data.get("tools"))
        except ValueError as exc:
            raise _invalid(str(exc)) from exc
    return value


def _check_template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    taken = sorted(RESERVED_TEMPLATE_VARIABLES.intersection(kwargs or ()))
    if taken:
        raise _invalid(f"chat_template_kwargs cannot set {', '.join(taken)}: jido sets those from the request")
    return kwargs


class _Body(BaseModel):
    # Strict: "5" is not a number, nor NaN or 1e999. Unknown fields (user, ...) are ignored, as vLLM does;
    # NOTE: fields jido cannot honour are refused before validation, by check_supported.
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, the counts so far on every chunk


class _SamplingBody(_Body):
    """Fields shared by completions and chat; SamplingParams checks the values' ranges and says why."""

    model: str | None = None
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: Stop = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    min_tokens: int | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    priority: int = 0  # vLLM's: admission order under --scheduling-policy priority, lower first
    # vLLM's P/D field: {"do_remote_decode": true} asks a KV producer to prefill and hold the KV; a consumer
    # gets back the producer's answer (a handle) to load it (see docs/disaggregation.md).
    kv_transfer_params: dict[str, Any] | None = None
    # OpenAI's {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}; and vLLM's
    # structured_outputs ({"json"|"regex"|"choice"|"grammar"|"json_object": ...}): enforced by the grammar engine.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    # vLLM's: each prompt token's log-probability and the top N alternatives, in the response's prompt_logprobs.
    # After stream: it reads it.
    prompt_logprobs: Annotated[int | None, AfterValidator(_check_prompt_logprobs)] = None

    def client_name(self, name: str) -> str:
        """The request field that set SamplingParams' ``name``, for error messages and ``param``."""
        return name

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage_stats(self) -> bool:
        return self.stream_options is not None and self.stream_options.continuous_usage_stats

    def sampling_params(self, max_tokens: int, logprobs: int | None,
                        prompt_logprobs: int | None = None) -> SamplingParams:
        """SamplingParams for this body; raises ValueError (a 400) for out-of-range values."""
        given = {name: getattr(self, name) for name in _SAMPLING_FIELDS if getattr(self, name) is not None}
        return SamplingParams(max_tokens=max_tokens, logprobs=logprobs, prompt_logprobs=prompt_logprobs,
                              structured_outputs=self.structured_outputs_params(), **given)

    @property
    def constraint_field(self) -> str:
        """The request field a structured-output constraint came from, for error messages."""
        if self.structured_outputs is not None:
            return "structured_outputs"
        kind = (self.response_format or {}).get("type")
        return "response_format.json_schema" if kind == "json_schema" else "response_format"

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """The constraint of ``structured_outputs`` or ``response_format``; raises ValueError naming the field."""
        if self.structured_outputs is not None:
            if self.response_format not in (None, {"type": "text"}):
                raise ValueError("structured_outputs and response_format cannot both constrain the output: "
                                 "give one of them")
            try:
                return StructuredOutputsParams(**self.structured_outputs)
            except TypeError as exc:  # a key StructuredOutputsParams does not have
                raise ValueError(f"structured_outputs has an unknown key: {exc}; allowed: json, regex, choice, "
                                 "grammar, json_object, disable_any_whitespace") from exc
        return response_format_params(self.response_format)


def response_format_params(response_format: dict[str, Any] | None) -> StructuredOutputsParams | None:
    """OpenAI's ``response_format`` as a constraint (None for text); raises ValueError naming what is wrong."""
    kind = None if response_format is None else response_format.get("type")
    if kind in (None, "text"):
        if response_format is not None and kind is None:
            raise ValueError('response_format needs a "type": "text", "json_object" or "json_schema"')
        return None
    if kind == "json_object":
        return StructuredOutputsParams(json_object=True)
    if kind != "json_schema":
        raise ValueError(f'response_format.type must be "text", "json_object" or "json_schema", got {kind!r}')
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
        raise ValueError('response_format.json_schema must be an object {"name": ..., "schema": {...}}')
    # OpenAI's schema is optional: without one any JSON object is allowed.
    schema = spec.get("schema")
    return StructuredOutputsParams(json_object=True) if schema is None else StructuredOutputsParams(json=schema)


class CompletionRequest(_SamplingBody):
    """POST /v1/completions. ``prompt`` is text or token ids (checked by the engine); one per request.

    ``echo`` puts the prompt in front of each choice's text and, with ``logprobs``, its tokens' logprobs
    in front of the generated ones' (as vLLM; how lm-evaluation-harness scores a text). ``max_tokens``
    may then be 0: the prompt alone.
    """

    prompt: Prompt
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    # CacheBlend (jido's): {"chunks": [doc, ...], "recompute_ratio": r}; ``prompt`` is then the question after them.
    kv_blend: dict[str, Any] | None = None

    @property
    def num_prompt_logprobs(self) -> int | None:
        """The prompt logprobs to compute: ``prompt_logprobs`` if given (as vLLM), else with echo as many as
        ``logprobs`` asks of each token."""
        if self.prompt_logprobs is not None or not self.echo:
            return self.prompt_logprobs
        # The engine takes max_tokens=0 only as "score the prompt": 0 alternatives costs a log-softmax per row.
        return self.logprobs if self.logprobs is not None or self.max_tokens != 0 else 0


class ChatMessage(_Body):
    """One message; ``content`` is text or a list of ``{"type": "text", "text": ...}`` parts. An assistant's
    message may hold its ``tool_calls``; a ``tool`` message answers the call ``tool_call_id``."""

    role: str
    content: Content = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatCompletionRequest(_SamplingBody):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int | None, AfterValidator(_check_top_logprobs)] = None  # after logprobs: it reads it
    add_generation_prompt: bool = True
    # Rendered into the prompt as the chat template defines; a call comes back as the model's text in content.
    tools: Annotated[list[dict[str, Any]] | None, AfterValidator(_check_tools)] = None
    # "auto" (the default with tools): calls are parsed from the answer under --enable-auto-tool-choice;
    # "required" or a named function: the grammar makes the answer a call; "none": text. After tools: it reads them.
    tool_choice: Annotated[str | dict[str, Any] | None, AfterValidator(_check_tool_choice)] = None
    parallel_tool_calls: bool = True
    # vLLM's: more variables for the chat template (e.g. {"enable_thinking": false} for Qwen3's).
    chat_template_kwargs: Annotated[dict[str, Any] | None, AfterValidator(_check_template_kwargs)] = None

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def client_name(self, name: str) -> str:
        if name == "logprobs":
            return "top_logprobs"  # chat's logprobs is a boolean; the count comes from top_logprobs
        if name == "max_tokens" and self.max_completion_tokens is not None:
            return "max_completion_tokens"
        return name

    @property
    def num_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def effective_tool_choice(self) -> str | dict[str, Any]:
        """``tool_choice`` as given, else OpenAI's default: ``auto`` with tools, ``none`` without."""
        return self.tool_choice if self.tool_choice is not None else ("auto" if self.tools else "none")

    @property
    def constraint_field(self) -> str:
        return "tools" if self.forced_call_schema() is not None else super().constraint_field

    def forced_call_schema(self) -> dict | None:
        return forced_call_schema(self.tools or [], self.effective_tool_choice, self.parallel_tool_calls)

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        schema = self.forced_call_schema()
        if schema is None:
            return super().structured_outputs_params()
        if self.structured_outputs is not None or self.response_format not in (None, {"type": "text"}):
            raise ValueError("tool_choice forces a tool call, which response_format or structured_outputs cannot "
                             "also constrain: give one of them")
        return StructuredOutputsParams(json=schema)

    def template_messages(self) -> list[dict[str, Any]]:
        """Messages with text content (and tool calls), as chat templates expect; raises ValueError for others."""
        return [_template_message(m, i) for i, m in enumerate(self.messages)]


def _template_message(message: ChatMessage, index: int) -> dict[str, Any]:
    # Checked here: the rendered prompt's text no longer says which message a bad character came from.
    check_encodable(message.role, f"messages[{index}].role")
    content = _text_content(message.content, index)
    check_encodable(content, f"messages[{index}].content")
    rendered: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        rendered["tool_calls"] = template_messages_tool_calls(message.tool_calls, index)
    for key in ("tool_call_id", "name"):
        if getattr(message, key) is not None:
            rendered[key] = getattr(message, key)
    return rendered


def _text_content(content: str | list[dict[str, Any]] | None, index: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    if all(p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise ValueError(f"messages[{index}].content must be a string or a list of "
                     '{"type": "text", "text": "..."} parts (jido serves text-only models)')


class CacheRequest(_Body):
    """POST /v1/cache: prefill ``prompt`` (text or token ids) once and pin its KV until DELETE /v1/cache/{id}."""

    model: str | None = None
    prompt: Annotated[str | list[int], _one_of("a string or an array of token ids",
                                               lambda v: isinstance(v, str) or _is_list_of(v, int))]


class TokenizeRequest(_Body):
    """POST /tokenize (vLLM's): the server tokenizer's ids for ``prompt``; any length, not only what fits."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool = False


class DetokenizeRequest(_Body):
    """POST /detokenize (vLLM's): the text of ``tokens``, special tokens included."""

    model: str | None = None
    tokens: list[int]
