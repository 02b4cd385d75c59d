"""Cache-augmented generation over HTTP: POST /v1/cache pins a prompt's KV, GET lists pins, DELETE releases one."""
from __future__ import annotations

import asyncio
import uuid

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from jido.core.pinned_prefixes import PinTooLargeError, TooManyPinsError
from jido.core.sampling_params import SamplingParams
from jido.engine.async_engine import EngineStoppedError
from jido.server.errors import APIError, bad_request, parse_json
from jido.server.metrics import RequestTimer
from jido.server.protocol import CacheRequest
from jido.server.serving import OpenAIServing, validate_body


class CacheServing:
    """The /v1/cache endpoints over the same engine as the OpenAI ones.

    A pin is a request that prefills its prompt and, once done, holds its blocks in the device pool; later
    prompts that start with it reuse them as any prefix-cache hit. A pin that would leave too little room
    for a ``max_model_len`` request is a 413; pins never evict or preempt running work.
    """

    def __init__(self, serving: OpenAIServing) -> None:
        self.serving = serving
        self.engine = serving.engine
        # DELETEd ids, hidden until the engine's next report stops listing them (the unpin runs on its thread).
        self._unpinned: set[str] = set()

    async def create(self, http_request: Request) -> Response:
        body = validate_body(CacheRequest, parse_json(await http_request.body()))
        self.serving.check_model(body.model)
        prompt_ids = await asyncio.to_thread(self.serving.completion_prompt_ids, body.prompt)
        pin_id = f"cache-{uuid.uuid4().hex}"
        try:
            stream = self.serving.submit(pin_id, prompt_ids, SamplingParams(max_tokens=1), RequestTimer(), pin=True)
        except ValueError as exc:  # an engine that cannot pin (data-parallel replicas)
            raise bad_request(str(exc)) from exc
        with stream:
            try:
                async for _ in stream:
                    pass
            except PinTooLargeError as exc:
                raise APIError(413, str(exc), param="prompt", code="cache_full") from exc
            except TooManyPinsError as exc:  # like cache_full, not a 429 that clients would retry with no end
                raise APIError(413, str(exc), code="too_many_pins") from exc
            except ValueError as exc:
                raise bad_request(str(exc), "prompt") from exc
            except EngineStoppedError as exc:
                raise APIError(503, str(exc), "service_unavailable", code="unavailable") from exc
        pinned = self._pins().get(pin_id)
        if pinned is None:  # aborted in between (a drain): nothing is held
            raise APIError(503, "the engine stopped before the prefix was pinned", "service_unavailable")
        return JSONResponse({"id": pin_id, "object": "cache", "num_tokens": len(prompt_ids),
                             "num_cached_tokens": pinned["num_cached_tokens"]})

    def list(self) -> Response:
        return JSONResponse({"object": "list", "data": list(self._pins().values())})

    def delete(self, pin_id: str) -> Response:
        if pin_id not in self._pins():
            raise APIError(404, f"no pinned prefix {pin_id!r}; GET /v1/cache lists them", param="id",
                           code="cache_not_found")
        self.engine.unpin(pin_id)
        self._unpinned.add(pin_id)
        return JSONResponse({"id": pin_id, "object": "cache", "deleted": True})

    def _pins(self) -> dict[str, dict]:
        block_bytes = self.serving.llm.kv_block_bytes
        listed = {p.pin_id: {"id": p.pin_id, "object": "cache", "num_cached_tokens": p.num_tokens,
                             "num_blocks": p.num_blocks, "num_bytes": p.num_blocks * block_bytes, "hits": p.hits}
                  for p in self.engine.last_report.stats.pinned}
        self._unpinned &= listed.keys()  # the report caught up with these: forget them
        return {pin_id: pin for pin_id, pin in listed.items() if pin_id not in self._unpinned}
