"""The router's HTTP app: the OpenAI endpoints it proxies, /health, /v1/models[/{id}], /tokenize, /detokenize and
/tokenizer_info (from a decode instance) and its own /metrics."""
from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import quote

from fastapi import FastAPI, Request
from starlette.responses import PlainTextResponse, Response

from jido.router.config import RouterConfig
from jido.router.proxy import Router

_PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"


def create_router_app(config: RouterConfig) -> FastAPI:
    """An app routing to ``config``'s instances; checks them when it starts (ValueError for a pair that cannot
    exchange KV) and keeps checking them while it runs."""
    router = Router(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await router.start()
        yield
        await router.stop()

    app = FastAPI(title="jido router", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.router = router

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> Response:
        return router.health()

    @app.api_route("/metrics", methods=["GET", "HEAD"])
    async def metrics() -> Response:
        return PlainTextResponse(router.metrics.render(), media_type=_PROMETHEUS_TEXT)

    @app.api_route("/v1/models", methods=["GET", "HEAD"])
    async def models() -> Response:
        return await router.passthrough("GET", "/v1/models")

    @app.api_route("/v1/models/{model_id:path}", methods=["GET", "HEAD"])
    async def model(model_id: str) -> Response:
        return await router.passthrough("GET", f"/v1/models/{quote(model_id, safe='/')}")

    @app.api_route("/tokenizer_info", methods=["GET", "HEAD"])
    async def tokenizer_info() -> Response:
        return await router.passthrough("GET", "/tokenizer_info")

    @app.post("/tokenize")
    async def tokenize(request: Request) -> Response:
        return await router.passthrough("POST", "/tokenize", await request.body())

    @app.post("/detokenize")
    async def detokenize(request: Request) -> Response:
        return await router.passthrough("POST", "/detokenize", await request.body())

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await router.handle("/v1/completions", await request.body())

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await router.handle("/v1/chat/completions", await request.body())

    return app
