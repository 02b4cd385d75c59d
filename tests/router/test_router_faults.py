"""The producer killed in the middle of a run of streaming requests through the router: every request completes
(the consumer prefills what the producer no longer can) or fails with a clear error, none hangs, and the consumer's
KV blocks are all free afterwards."""
from __future__ import annotations

import asyncio
import json
import signal

import aiohttp
import torch
from router_harness import router, serve_process, tiny_server
from server.server_harness import metric, wait_until
from tiny_model_folder import BOS_ID, VOCAB_SIZE

NUM_REQUESTS = 12


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [[BOS_ID, *torch.randint(3, VOCAB_SIZE, (n,), generator=gen).tolist()] for n in (35, 50, 28, 44)]


def _body(prompt: list[int], stream: bool) -> dict:
    return {"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True, "stream": stream}


async def _stream(session: aiohttp.ClientSession, url: str, prompt: list[int]) -> str:
    """The streamed text, or "error: ..." with the message of an error status or event."""
    async with session.post(f"{url}/v1/completions", json=_body(prompt, True),
                            timeout=aiohttp.ClientTimeout(total=60)) as resp:
        raw = (await resp.read()).decode()
    if resp.status != 200:
        return f"error: {json.loads(raw)['error']['message']}"
    text = ""
    for line in raw.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line[6:])
        if "error" in event:
            return f"error: {event['error']['message']}"
        text += "".join(c["text"] for c in event["choices"])
    return text


async def _run_and_kill(url: str, prompts: list[list[int]], producer) -> list[str]:
    async with aiohttp.ClientSession() as session:
        async def one(i: int) -> str:
            await asyncio.sleep(0.15 * i)  # arrivals spread over the kill
            return await _stream(session, url, prompts[i % len(prompts)])

        tasks = [asyncio.create_task(one(i)) for i in range(NUM_REQUESTS)]
        await asyncio.sleep(0.5)
        producer.send_signal(signal.SIGKILL)
        return await asyncio.wait_for(asyncio.gather(*tasks), 120)  # none may hang


def test_killing_the_producer_mid_run_leaves_no_request_hanging_and_no_block_held(tiny_model_folder, tmp_path):
    prompts = _prompts()
    with tiny_server(tiny_model_folder) as colocated:
        expected = []
        for p in prompts:
            status, _, body = colocated.request("POST", "/v1/completions", _body(p, False))
            expected.append(json.loads(body)["choices"][0]["text"])
    with serve_process(tiny_model_folder, "kv_producer", "tcp", tmp_path) as (prefill_url, producer), \
            tiny_server(tiny_model_folder, "kv_consumer", kv_transfer_timeout_s=1.0) as decode, \
            router([prefill_url], [decode.base_url], prefill_timeout_s=10) as proxy:
        results = asyncio.run(_run_and_kill(proxy.base_url, prompts, producer))
        for i, result in enumerate(results):
            assert result == expected[i % len(prompts)] or result.startswith("error: ") and len(result) > 20, result
        assert sum(r == expected[i % len(prompts)] for i, r in enumerate(results)) == NUM_REQUESTS
        routed = proxy.metrics()
        assert metric(routed, "jido:router_fallbacks_total") > 0
        wait_until(lambda: metric(proxy.metrics(), "jido:router_instance_healthy", role="prefill") == 0, 10,
                   "the router to take the dead producer out")
        engine = decode.serving.llm
        wait_until(lambda: engine.core.scheduler.kv.usage == 0.0 and not engine.core.scheduler.loads, 30,
                   "the consumer to free every block")
