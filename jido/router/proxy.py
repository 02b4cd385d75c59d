"""Router: per request, picks a prefill and a decode instance, hands the KV over, and relays the answer.

With a prefill pool, a prompt long enough (``--prefill-threshold``, or any prompt while the decode instance's
queue is long) first goes to a prefill instance with ``max_tokens=1`` and ``kv_transfer_params:
{"do_remote_decode": true}`` (plus the decode instance's KV endpoint when the producer pushes); its answer's
``kv_transfer_params`` (a handle to the KV) rides with the original request to the decode instance, which
loads the KV and generates the whole answer, streamed back as it comes. When the prefill instance fails,
times out or returns no handle, the decode instance gets the request without one and prefills itself: the
client still gets its answer (``jido:router_fallbacks``). Without a prefill pool the router balances the
decode instances (data-parallel, cache-aware). Instances are picked by least outstanding tokens with
prefix-hash affinity (:class:`jido.router.instances.Pool`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from starlette.responses import JSONResponse, Response, StreamingResponse

from jido.kvtransfer.handoff import KVFormat, KVFormatError
from jido.router.affinity import prefix_hashes
from jido.router.config import RouterConfig
from jido.router.instances import Instance, Pool
from jido.router.metrics import RouterMetrics

logger = logging.getLogger("jido")
_DEFAULT_MAX_TOKENS = 16  # what the OpenAI completions API generates when max_tokens is absent


class RouterError(Exception):
    """An answer the router gives itself: an OpenAI-style error body with an HTTP status."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code

    def response(self) -> JSONResponse:
        return JSONResponse({"error": {"message": str(self), "type": "router_error", "code": self.code}},
                            status_code=self.status)


def derive_prefill_threshold(calibration: dict[str, float]) -> int:
    """The prompt length from which a hand-off costs the decode instance less than prefilling itself.

    Locally the decode instance spends ``prefill_s_per_token`` per prompt token (and stalls its streams that
    long); a hand-off costs it ``transfer_fixed_s`` plus ``transfer_s_per_token`` per token, so the two meet at
    ``fixed / (prefill - transfer)`` tokens. Never, when a token's transfer costs as much as its prefill.
    """
    try:
        prefill, per_token = float(calibration["prefill_s_per_token"]), float(calibration["transfer_s_per_token"])
        fixed = float(calibration["transfer_fixed_s"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"calibration needs prefill_s_per_token, transfer_s_per_token and transfer_fixed_s: "
                         f"{exc!r}") from None
    if prefill <= per_token:
        return 2**31 - 1
    return max(0, math.ceil(fixed / (prefill - per_token)))


class Router:
    """The pools, their health, and the request path; one per router app."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.prefill = Pool([Instance(u, "prefill") for u in config.prefill or []], config.balance_threshold)
        self.decode = Pool([Instance(u, "decode") for u in config.decode or []], config.balance_threshold)
        self.metrics = RouterMetrics(self.prefill.instances + self.decode.instances)
        self.prefill_threshold = config.prefill_threshold
        if config.calibration is not None:
            self.prefill_threshold = derive_prefill_threshold(json.loads(Path(config.calibration).read_text()))
            logger.info("router: prompts of %d tokens or more go to a prefill instance (from %s)",
                        self.prefill_threshold, config.calibration)
        self._session: aiohttp.ClientSession | None = None
        self._health_task: asyncio.Task | None = None

    # -- lifetime ----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Check every instance once (a prefill/decode pair that cannot exchange KV raises ValueError), then
        keep checking them in the background."""
        self._session = aiohttp.ClientSession()
        await self.check_health()
        self.check_compatibility(strict=True)
        self._health_task = asyncio.create_task(self._health_loop())

    async def stop(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
        if self._session is not None:
            await self._session.close()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_check_interval_s)
            await self.check_health()
            self.check_compatibility(strict=False)

    # -- health ------------------------------------------------------------------------------------
    async def check_health(self) -> None:
        """Ask every instance's /health (and, once up, its /kv_transfer and queue length)."""
        instances = self.prefill.instances + self.decode.instances
        await asyncio.gather(*(self._check(i) for i in instances))

    async def _check(self, instance: Instance) -> None:
        pool = self.prefill if instance.role == "prefill" else self.decode
        timeout = aiohttp.ClientTimeout(total=self.config.health_check_timeout_s)
        try:
            async with self._session.get(f"{instance.url}/health", timeout=timeout) as resp:
                if resp.status != 200:
                    raise aiohttp.ClientError(f"/health answered {resp.status}")
            if instance.kv_info is None:
                async with self._session.get(f"{instance.url}/kv_transfer", timeout=timeout) as resp:
                    instance.kv_info = await resp.json() if resp.status == 200 else {}
            instance.num_waiting = await self._num_waiting(instance, timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            pool.mark_down(instance, str(exc) or type(exc).__name__)
            instance.kv_info = None  # a restarted instance may come back with another KV endpoint
            return
        if not instance.healthy:
            logger.info("router: %s instance %s is in", instance.role, instance.url)
        instance.healthy = True

    async def _num_waiting(self, instance: Instance, timeout: aiohttp.ClientTimeout) -> int:
        async with self._session.get(f"{instance.url}/metrics", timeout=timeout) as resp:
            if resp.status != 200:
                return 0
            text = await resp.text()
        return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("vllm:num_requests_waiting")))

    def check_compatibility(self, strict: bool) -> None:
        """Every usable prefill instance must be able to hand KV to every usable decode instance.

        Raises ValueError (``strict``, at startup) naming the pair and what differs; otherwise takes the
        offending instance out and logs why.
        """
        if not self.prefill.instances:
            return
        for instance in self.prefill.instances + self.decode.instances:
            if instance.healthy and instance.kv_info is not None:
                instance.incompatible = self._role_problem(instance)
        for p in (i for i in self.prefill.instances if i.healthy and i.kv_info):
            for d in (i for i in self.decode.instances if i.healthy and i.kv_info):
                problem = _pair_problem(p.kv_info, d.kv_info)
                if problem:
                    d.incompatible = f"cannot load KV from {p.url}: {problem}"
        bad = [i for i in self.prefill.instances + self.decode.instances if i.incompatible]
        if bad and strict:
            raise ValueError("; ".join(f"{i.role} instance {i.url} {i.incompatible}" for i in bad))
        for instance in bad:
            logger.error("router: %s instance %s kept out: %s", instance.role, instance.url, instance.incompatible)

    @staticmethod
    def _role_problem(instance: Instance) -> str:
        info = instance.kv_info
        if not info:
            return "has no --kv-transfer-config (it cannot hand KV over)"
        wanted = ("kv_producer", "kv_both") if instance.role == "prefill" else ("kv_consumer", "kv_both")
        if info.get("kv_role") not in wanted:
            return f"is a {info.get('kv_role')}, not one of {', '.join(wanted)}"
        return ""

    # -- the request path --------------------------------------------------------------------------
    async def handle(self, path: str, raw: bytes) -> Response:
        arrival = time.monotonic()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
        except ValueError as exc:
            return RouterError(400, f"the request body is not valid JSON: {exc}", "invalid_json").response()
        text = _prompt_text(body)
        hashes = prefix_hashes(text, self.config.cache_block_chars)
        prompt_tokens = _estimate_tokens(body, text, self.config.chars_per_token)
        num_tokens = prompt_tokens + _max_tokens(body)
        decode, why = self.decode.pick(hashes)
        if decode is None:
            self.metrics.failed.inc()
            return RouterError(503, "no decode instance is healthy", "no_instance").response()
        self._count_affinity(why, "decode")
        params, decision = None, "data_parallel"
        if self.prefill.instances:
            decision = "local_prefill"
            if self._disaggregate(body, prompt_tokens, decode):
                try:
                    params, decision = await self._prefill(path, body, hashes, prompt_tokens, decode)
                except RouterError as exc:  # the request itself is bad: the decode instance would say the same
                    return exc.response()
        self.metrics.decisions[decision].inc()
        forwarded = body if params is None else {**body, "kv_transfer_params": params}
        return await self._forward(path, forwarded, decode, hashes, num_tokens, arrival)

    def _count_affinity(self, why: str, role: str) -> None:
        if why == "affinity":
            self.metrics.affinity.labels(role).inc()

    def _disaggregate(self, body: dict[str, Any], prompt_tokens: int, decode: Instance) -> bool:
        """Selective disaggregation: long prompts, or any while the decode instance's queue is long; never a
        request that scores its prompt (echo, prompt_logprobs: the decode instance must compute it)."""
        if body.get("echo") or body.get("prompt_logprobs") is not None:
            return False
        return prompt_tokens >= self.prefill_threshold or decode.num_waiting > self.config.decode_queue_threshold

    async def _prefill(self, path: str, body: dict[str, Any], hashes: list[bytes], prompt_tokens: int,
                       decode: Instance) -> tuple[dict | None, str]:
        """Have a prefill instance prefill the prompt; its KV handle, or (None, "fallback") when it fails."""
        producer, why = self.prefill.pick(hashes)
        if producer is None:
            return self._fallback("no_producer", "no prefill instance is healthy")
        self._count_affinity(why, "prefill")
        request = _prefill_body(path, body)
        ask: dict[str, Any] = {"do_remote_decode": True}
        if (producer.kv_info or {}).get("kv_mode") == "push" and decode.kv_address is not None:
            ask["remote_host"], ask["remote_port"] = decode.kv_address
        request["kv_transfer_params"] = ask
        self.prefill.start(producer, hashes, prompt_tokens)
        start = time.monotonic()
        try:
            timeout = aiohttp.ClientTimeout(total=self.config.prefill_timeout_s)
            async with self._session.post(f"{producer.url}{path}", json=request, timeout=timeout) as resp:
                status, data = resp.status, await resp.read()
        except asyncio.TimeoutError:
            return self._fallback("producer_timeout", f"{producer.url} took over {self.config.prefill_timeout_s} s")
        except aiohttp.ClientError as exc:
            self.prefill.mark_down(producer, str(exc))
            return self._fallback("producer_error", f"{producer.url}: {exc}")
        finally:
            self.prefill.done(producer, prompt_tokens)
        self.metrics.prefill_time.observe(time.monotonic() - start)
        if 400 <= status < 500 and status not in (408, 429):
            raise RouterError(status, _error_message(data), "invalid_request")
        if status != 200:
            return self._fallback("producer_error", f"{producer.url} answered {status}: {_error_message(data)}")
        handle = json.loads(data).get("kv_transfer_params")
        if not handle:  # it stopped on its first token: nothing to decode, the decode instance redoes one token
            return self._fallback("no_handle", f"{producer.url} returned no KV handle")
        return handle, "disaggregated"

    def _fallback(self, reason: str, detail: str) -> tuple[None, str]:
        logger.warning("router: prefill failed (%s); the decode instance prefills itself", detail)
        self.metrics.fallbacks[reason].inc()
        return None, "fallback"

    async def _forward(self, path: str, body: dict[str, Any], decode: Instance, hashes: list[bytes],
                       num_tokens: int, arrival: float) -> Response:
        """Send the request to ``decode`` (another decode instance if it fails before answering) and relay."""
        tried: tuple[Instance, ...] = ()
        instance: Instance | None = decode
        while instance is not None:
            self.decode.start(instance, hashes, num_tokens)
            try:
                timeout = aiohttp.ClientTimeout(total=self.config.request_timeout_s)
                resp = await self._session.post(f"{instance.url}{path}", json=body, timeout=timeout)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                self.decode.done(instance, num_tokens)
                self.decode.mark_down(instance, str(exc) or type(exc).__name__)
                tried += (instance,)
                instance, _ = self.decode.pick(hashes, exclude=tried)
                continue
            if body.get("stream"):
                return StreamingResponse(self._relay(resp, instance, num_tokens, arrival), status_code=resp.status,
                                         media_type=resp.content_type)
            try:
                data = await resp.read()
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                self.decode.mark_down(instance, str(exc))
                self.metrics.failed.inc()
                return RouterError(502, f"the decode instance {instance.url} failed mid-answer: {exc}",
                                   "upstream_failed").response()
            finally:
                resp.release()
                self.decode.done(instance, num_tokens)
            return Response(data, status_code=resp.status, media_type=resp.content_type)
        self.metrics.failed.inc()
        return RouterError(503, "every decode instance failed to take the request", "no_instance").response()

    async def _relay(self, resp: aiohttp.ClientResponse, instance: Instance, num_tokens: int,
                     arrival: float) -> AsyncIterator[bytes]:
        """The decode instance's stream, chunk by chunk; if it breaks off, an error event and ``[DONE]``."""
        first = True
        try:
            async for chunk in resp.content.iter_any():
                if first:
                    self.metrics.ttft.observe(time.monotonic() - arrival)
                    first = False
                yield chunk
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            self.decode.mark_down(instance, str(exc) or type(exc).__name__)
            self.metrics.failed.inc()
            error = {"error": {"message": f"the decode instance {instance.url} failed mid-stream: {exc}",
                               "type": "router_error", "code": "upstream_failed"}}
            yield f"data: {json.dumps(error)}\n\ndata: [DONE]\n\n".encode()
        finally:
            resp.release()
            self.decode.done(instance, num_tokens)

    async def passthrough(self, method: str, path: str, raw: bytes | None = None) -> Response:
        """An endpoint every instance answers alike for the one model they serve (/v1/models, /tokenize,
        /detokenize, /tokenizer_info), answered by the first healthy decode instance; `jido bench` counts prompt tokens with it."""
        headers = {"Content-Type": "application/json"} if raw is not None else None
        for instance in self.decode.usable():
            try:
                async with self._session.request(method, f"{instance.url}{path}", data=raw, headers=headers,
                                                 timeout=aiohttp.ClientTimeout(total=10)) as resp:
                    return Response(await resp.read(), status_code=resp.status, media_type=resp.content_type)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                self.decode.mark_down(instance, str(exc))
        return RouterError(503, "no decode instance is healthy", "no_instance").response()

    def health(self) -> Response:
        status = {"prefill": [i.url for i in self.prefill.usable()], "decode": [i.url for i in self.decode.usable()]}
        if not status["decode"]:
            return JSONResponse({"status": "no healthy decode instance", **status}, status_code=503)
        return JSONResponse({"status": "ok", **status})


def _pair_problem(producer: dict[str, Any], consumer: dict[str, Any]) -> str:
    """Why a producer's KV cannot be loaded by a consumer ("" when it can)."""
    if producer.get("kv_connector") != consumer.get("kv_connector"):
        return (f"the prefill instance sends KV over {producer.get('kv_connector')!r}, the decode instance over "
                f"{consumer.get('kv_connector')!r}: give both the same kv_connector")
    try:
        KVFormat.from_dict(consumer["format"]).check_compatible(KVFormat.from_dict(producer["format"]))
    except (KVFormatError, KeyError, ValueError) as exc:
        return str(exc)
    return ""


def _prefill_body(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The request a prefill instance gets: one token, no stream, one choice."""
    request = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "n", "kv_transfer_params")}
    request["stream"] = False
    if path.endswith("chat/completions"):
        request.pop("max_tokens", None)
        request["max_completion_tokens"] = 1
    else:
        request["max_tokens"] = 1
    return request


def _prompt_text(body: dict[str, Any]) -> str:
    """The prompt as text, for prefix hashing: a completion's prompt (ids written out) or the chat messages."""
    if "messages" in body and isinstance(body["messages"], list):
        return "".join(f"{m.get('role')}:{m.get('content')}\n" for m in body["messages"] if isinstance(m, dict))
    prompt = body.get("prompt", "")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else " ".join(map(str, prompt))


def _estimate_tokens(body: dict[str, Any], text: str, chars_per_token: float) -> int:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return len(prompt)
    return math.ceil(len(text) / chars_per_token)


def _max_tokens(body: dict[str, Any]) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    return value if isinstance(value, int) and value > 0 else _DEFAULT_MAX_TOKENS


def _error_message(data: bytes) -> str:
    try:
        return str(json.loads(data)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return data[:200].decode("utf-8", "replace")
