"""The FastAPI app: routes, error mapping and the engine's lifetime."""
from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, PlainTextResponse, Response

from jido.engine.async_engine import AsyncEngine, EngineStoppedError
from jido.engine.chat_template import load_chat_template
from jido.engine.data_parallel import DataParallelEngine
from jido.engine.llm_engine import LLMEngine
from jido.server.cache_serving import CacheServing
from jido.server.config import ServerConfig
from jido.server.errors import APIError, http_error
from jido.server.metrics import ServerMetrics
from jido.server.middleware import GuardMiddleware
from jido.server.serving import OpenAIServing
from jido.utils.cpp_build import REBUILD_COMMAND

logger = logging.getLogger("jido")
_PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def create_app(llm: LLMEngine | Sequence[LLMEngine], config: ServerConfig,
               on_engine_failure: Callable[[BaseException], None] | None = None) -> FastAPI:
    """An app serving ``llm`` (or data-parallel replicas of one model, each request routed to one); the engine
    threads start and stop with the app's lifespan.

    ``on_engine_failure`` is called (on the event loop) if the engine loop dies, e.g. when a worker is killed;
    every open request has then been ended with the error. Raises FileNotFoundError or ValueError when the
    chat template cannot be loaded.
    """
    replicas = [llm] if isinstance(llm, LLMEngine) else list(llm)
    llm = replicas[0]
    model_name = config.model_name(llm.config.model_config.model)
    template = load_chat_template(llm.tokenizer, config.chat_template)
    offload = llm.config.kv_offload
    parallel = llm.config.parallel_config
    num_expert_ranks = (parallel.tensor_parallel_size if parallel.enable_expert_parallel else 1
                        ) if llm.model_arch.num_experts else 0
    spec = llm.config.speculative_config
    metrics = ServerMetrics(model_name, llm.max_model_len, tuple(t.name for t in offload.tiers) if offload else (),
                            llm.kv_block_bytes, num_expert_ranks, llm.config.kv_transfer_config is not None,
                            0 if spec is None else spec.max_num_speculative_tokens, llm.kernel_fallbacks)
    if llm.kernel_fallbacks:
        logger.error("serving with %d C++ kernel libraries on their slower fallbacks: %s. Run `%s` to rebuild them "
                     "(it keeps each compiler's output); /metrics shows them as jido:kernel_fallback_info",
                     len(llm.kernel_fallbacks),
                     "; ".join(f"{lib}: {what}" for lib, what in sorted(llm.kernel_fallbacks.items())),
                     REBUILD_COMMAND)
    engine_class = AsyncEngine if len(replicas) == 1 else DataParallelEngine
    engine = engine_class(replicas[0] if len(replicas) == 1 else replicas, config.max_waiting_requests,
                          on_report=lambda report: metrics.on_report(report, engine.num_waiting),
                          on_failure=on_engine_failure)
    serving = OpenAIServing(engine, model_name, template, metrics, config.auto_tool_call_parser)
    cache = CacheServing(serving)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine.start()
        yield
        await engine.shutdown()
        metrics.close()

    # No /docs, /redoc or /openapi.json: the UIs load from a CDN, and the schema would list the routes
    # without their bodies (the handlers parse raw requests), telling clients less than OpenAI's API docs.
    app = FastAPI(title="jido", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serving, app.state.cache = serving, cache
    app.include_router(_routes)
    app.include_router(_cache_routes)
    if config.enable_tokenizer_info_endpoint:  # vLLM serves it only when asked (--enable-tokenizer-info-endpoint)
        app.include_router(_tokenizer_info_route)
    _add_error_handlers(app)
    app.add_middleware(GuardMiddleware, api_key=config.api_key, max_body_bytes=config.max_request_body_bytes,
                       read_timeout_s=config.request_read_timeout_s)
    return app


# The handlers live at module level and find the app's serving objects on ``request.app.state``, as vLLM's do.
# Closures over them would outlive the app: FastAPI keeps every endpoint it has classified in a process-wide cache
# (4,096 entries), so each app made in one process (tests, benchmarks) kept its whole engine resident.
_routes, _cache_routes, _tokenizer_info_route = APIRouter(), APIRouter(), APIRouter()


def _get(router: APIRouter, path: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A GET route that answers HEAD too (load balancers probe with HEAD); uvicorn drops the HEAD body."""
    return router.api_route(path, methods=["GET", "HEAD"])


def _serving(request: Request) -> OpenAIServing:
    return request.app.state.serving


@_get(_routes, "/health")
async def health(request: Request) -> Response:
    try:
        _serving(request).engine.check_health()
    except EngineStoppedError as exc:
        return http_error(503, str(exc), "engine_dead").response()
    return JSONResponse({"status": "ok"})


@_get(_routes, "/metrics")
async def metrics(request: Request) -> Response:
    return PlainTextResponse(_serving(request).metrics.render(), media_type=_PROMETHEUS_TEXT)


@_get(_routes, "/v1/models")
async def models(request: Request) -> Response:
    return JSONResponse(_serving(request).models())


@_get(_routes, "/v1/models/{model_id:path}")  # :path: a served name may hold a slash (Qwen/Qwen2.5-0.5B)
async def model(request: Request, model_id: str) -> Response:
    return JSONResponse(_serving(request).model(model_id))


@_get(_routes, "/kv_transfer")
async def kv_transfer(request: Request) -> Response:
    return JSONResponse(_serving(request).kv_transfer())


@_routes.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _serving(request).completions(request)


@_routes.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _serving(request).chat(request)


@_routes.post("/tokenize")
async def tokenize(request: Request) -> Response:
    return await _serving(request).tokenize(request)


@_routes.post("/detokenize")
async def detokenize(request: Request) -> Response:
    return await _serving(request).detokenize(request)


@_get(_tokenizer_info_route, "/tokenizer_info")
async def get_tokenizer_info(request: Request) -> Response:
    return JSONResponse(_serving(request).tokenizer_info())


# Cache-augmented generation: pin a prompt's KV (POST), list the pins (GET), release one (DELETE).
def _cache(request: Request) -> CacheServing:
    return request.app.state.cache


@_cache_routes.post("/v1/cache")
async def create_cache(request: Request) -> Response:
    return await _cache(request).create(request)


@_get(_cache_routes, "/v1/cache")
async def list_cache(request: Request) -> Response:
    return _cache(request).list()


@_cache_routes.delete("/v1/cache/{pin_id}")
async def delete_cache(request: Request, pin_id: str) -> Response:
    return _cache(request).delete(pin_id)


def _add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> Response:
        return exc.response()

    @app.exception_handler(HTTPException)
    async def http_exception(request: Request, exc: HTTPException) -> Response:
        return http_error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}").response()

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error on %s", request.url.path)
        return APIError(500, f"internal server error: {exc}", "server_error").response()
