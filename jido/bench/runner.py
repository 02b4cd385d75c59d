"""Drives one run: Poisson (or gamma) arrivals capped by a concurrency limit, then the run's result dict."""
from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence
from typing import Any

import aiohttp
import numpy as np

from jido.bench.client import RequestOutcome, build_payload, send_request
from jido.bench.config import BenchConfig
from jido.bench.datasets import SampleRequest
from jido.bench.machine import machine_info, now_iso
from jido.bench.progress import ProgressBar
from jido.bench.server_metrics import GaugeSampler, run_metrics, scrape
from jido.bench.summary import summarize

# Not one of the run's prompts: warming up with one would put it in the server's prefix cache.
WARMUP = SampleRequest("Say hello in one short sentence.", 7, 8)


class BenchError(RuntimeError):
    """The server could not be benchmarked at all (unreachable, no model, first request failed)."""


def arrival_offsets(num: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Send times in seconds from the start: gamma gaps of mean 1/rate (Poisson when burstiness is 1)."""
    if math.isinf(rate):
        return np.zeros(num)
    # Its own stream of the seed, so the same prompts arrive at the same times whatever the dataset drew.
    rng = np.random.default_rng([seed, 1])
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


async def run_benchmark(config: BenchConfig, requests: Sequence[SampleRequest],
                        label: str | None = None) -> dict[str, Any]:
    """Send every request to the server under the config's load; return the result dict to print and save.

    ``label`` names the run on its progress bar (default: its load).
    """
    base = config.base_url.rstrip("/")
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=config.request_timeout_s),
                                     connector=aiohttp.TCPConnector(limit=config.max_concurrency or 0),
                                     trust_env=False) as session:
        server = await server_info(session, base)
        model = config.model or _first_model(server, base)
        await _warm_up(session, config, model)
        before = await scrape(session, f"{base}/metrics")
        sampler = GaugeSampler(session, f"{base}/metrics")
        sampling = asyncio.create_task(sampler.run()) if before is not None else None
        outcomes, duration = await _drive(session, config, model, requests, label or _load_label(config))
        sampler.stop()
        if sampling is not None:
            await sampling
        after = await scrape(session, f"{base}/metrics")
    return {**_run_header(config, model, server), **summarize(outcomes, duration, config.slos_ms),
            **run_metrics(before, after, sampler.samples)}


async def server_info(session: aiohttp.ClientSession, base: str) -> dict[str, Any]:
    """The served models (from /v1/models), the Server header, and /version where the server has one."""
    info: dict[str, Any] = {}
    try:
        async with session.get(f"{base}/v1/models") as response:
            info["server_header"] = response.headers.get("Server")
            body = await response.json(content_type=None) if response.status == 200 else {}
        info["models"] = [{"id": m.get("id"), "owned_by": m.get("owned_by")} for m in body.get("data", [])]
        async with session.get(f"{base}/version") as response:
            if response.status == 200:
                info["version"] = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        info.setdefault("error", f"{type(exc).__name__}: {exc}")
    return info


def _first_model(server: dict[str, Any], base: str) -> str:
    if server.get("models"):
        return server["models"][0]["id"]
    raise BenchError(f"{base}/v1/models listed no model ({server.get('error', 'empty list')}); "
                     f"is the server up? Pass --model to name one")


async def _warm_up(session: aiohttp.ClientSession, config: BenchConfig, model: str) -> None:
    """One short request before timing starts, so a wrong URL or model fails fast with the server's reason."""
    outcome = await send_request(session, config.base_url.rstrip("/") + config.endpoint,
                                 build_payload(config, model, WARMUP), WARMUP.prompt_len)
    if not outcome.success:
        raise BenchError(f"the first request to {config.base_url}{config.endpoint} failed: {outcome.error}")


async def _drive(session: aiohttp.ClientSession, config: BenchConfig, model: str,
                 requests: Sequence[SampleRequest], label: str) -> tuple[list[RequestOutcome], float]:
    url = config.base_url.rstrip("/") + config.endpoint
    limit = asyncio.Semaphore(config.max_concurrency) if config.max_concurrency else None
    bar = ProgressBar(len(requests), label=label, disable=config.disable_tqdm)

    async def one(request: SampleRequest) -> RequestOutcome:
        async with limit or contextlib.nullcontext():
            outcome = await send_request(session, url, build_payload(config, model, request), request.prompt_len)
        bar.update(outcome.success)
        return outcome

    offsets = arrival_offsets(len(requests), config.request_rate, config.burstiness, config.seed)
    start, tasks = time.perf_counter(), []
    for request, offset in zip(requests, offsets):
        await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
        tasks.append(asyncio.create_task(one(request)))
    outcomes = await asyncio.gather(*tasks)
    duration = time.perf_counter() - start
    bar.close()
    return list(outcomes), duration


def _load_label(config: BenchConfig) -> str:
    return f"rate={_rate_value(config.request_rate)} concurrency={config.max_concurrency or 'inf'}"


def _rate_value(rate: float) -> float | str:
    # JSON has no infinity; vLLM writes the string "inf".
    return "inf" if math.isinf(rate) else rate


def _run_header(config: BenchConfig, model: str, server: dict[str, Any]) -> dict[str, Any]:
    return {"date": now_iso(), "backend": "openai-chat" if config.is_chat else "openai", "model_id": model,
            "base_url": config.base_url, "endpoint": config.endpoint, "dataset_name": config.dataset_name,
            "num_prompts": config.num_prompts, "request_rate": _rate_value(config.request_rate),
            "burstiness": config.burstiness, "max_concurrency": config.max_concurrency, "seed": config.seed,
            "ignore_eos": config.ignore_eos, "temperature": config.temperature, "tokenizer": config.tokenizer,
            "goodput_slos_ms": config.slos_ms or None, "machine": machine_info(), "server_info": server}
