"""Soak: mixed traffic against a `jido serve` of its own on loopback for a bounded time; nothing may be lost.

    flock /tmp/jido-bench.lock .venv/bin/python benchmarks/soak.py --duration-s 600

Starts `jido serve` on a free 127.0.0.1 port with the default model (a base model: its chats get Gemma's turn
format from tests/fixtures), then `--concurrency` clients send, until
`--duration-s` has passed: completions and chats, streamed or not, of varied lengths; streams the client
drops after a few events; bodies over the size limit, malformed JSON, wrong types, NaN and too-long prompts.
Counts requests sent, succeeded, rejected (by status) and lost: an answer that is not well-formed, a
connection error the client did not cause, or a 5xx. Unexpected answers (a 200 to a malformed request, a
400 to a good one) are counted apart. At the end the server must be idle (0 running, 0 waiting, KV usage 0
in /metrics), and it must exit 0 on SIGTERM. Prints and writes JSON (`--out`); exits 1 unless all held.
"""
from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import platform
import random
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from jido.planner.prometheus import parse_metrics

GEMMA_CHAT_TEMPLATE = Path(__file__).parents[1] / "tests" / "fixtures" / "gemma3_chat_template.jinja"
GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")
BODY_LIMIT = 256 * 1024
WORDS = "the a cat sat on mat of river stone light north wind slow bright seven".split()


@dataclass
class SoakResult:
    sent: int = 0
    succeeded: int = 0
    disconnected: int = 0  # streams this client dropped on purpose
    rejected: dict[str, int] = field(default_factory=dict)  # status code -> count
    lost: int = 0
    unexpected: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)  # the first few lost or unexpected, to read
    gauges: dict[str, float | None] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.unexpected == 0 and all(v == 0 for v in self.gauges.values())

    def note(self, outcome: str, detail: str = "") -> None:
        if outcome in ("lost", "unexpected"):
            setattr(self, outcome, getattr(self, outcome) + 1)
            if len(self.failures) < 20:
                self.failures.append(f"{outcome}: {detail}"[:500])


# -- requests -----------------------------------------------------------------------------------------------
def _text(rng: random.Random, num_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(num_words))


def _good_body(rng: random.Random, chat: bool, stream: bool) -> dict:
    words = rng.choice([1, 4, 16, 64, 256])
    body: dict = {"max_tokens": rng.choice([1, 4, 16, 48]), "stream": stream, "temperature": rng.choice([0, 0.7])}
    if rng.random() < 0.3:
        body.update(n=rng.choice([1, 2]), seed=rng.randrange(1000))
    if rng.random() < 0.2:
        body["stop"] = [rng.choice(WORDS)]
    if chat:
        body["messages"] = [{"role": "user", "content": _text(rng, words)}]
    else:
        body["prompt"] = _text(rng, words)
    return body


# (kind, path, body or raw bytes, the status that must come back)
def _bad_request(rng: random.Random) -> tuple[str, str, bytes, int]:
    path = rng.choice(["/v1/completions", "/v1/chat/completions"])
    kind = rng.choice(["oversized", "malformed_json", "wrong_type", "nan", "too_long_prompt", "unsupported"])
    body = {"oversized": b'{"prompt": "' + b"x" * (BODY_LIMIT + 1) + b'"}',
            "malformed_json": b'{"prompt": "Hi", "max_tokens": ',
            "wrong_type": b'{"prompt": "Hi", "messages": 5, "max_tokens": "ten"}',
            "nan": b'{"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}',
            # Past --max-model-len in tokens, or in bytes for the chat (refused before tokenizing).
            "too_long_prompt": json.dumps({"prompt": [2] * 20_000, "messages": [
                {"role": "user", "content": "cat " * 20_000}]}).encode(),
            "unsupported": b'{"prompt": "Hi", "messages": [{"role": "user", "content": "Hi"}], "suffix": "end", '
                           b'"tools": [{"type": "function"}]}'}[kind]
    return kind, path, body, 413 if kind == "oversized" else 400


async def _send_good(session: aiohttp.ClientSession, base: str, rng: random.Random, result: SoakResult) -> None:
    chat, stream = rng.random() < 0.5, rng.random() < 0.5
    drop_after = rng.choice([1, 2, 3]) if stream and rng.random() < 0.3 else None
    kind = f"{'chat' if chat else 'completion'}{'_stream' if stream else ''}{'_dropped' if drop_after else ''}"
    result.by_kind[kind] = result.by_kind.get(kind, 0) + 1
    body = _good_body(rng, chat, stream)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    async with session.post(base + path, json=body) as response:
        if response.status != 200:
            raw = await response.read()
            _judge_status(result, response.status, raw, 200, kind)
            return
        if not stream:
            _judge_json(result, await response.read(), body.get("n", 1), kind)
            return
        events = []
        async for line in response.content:
            if line.startswith(b"data: "):
                events.append(line[6:].strip())
                if drop_after is not None and len(events) >= drop_after and events[-1] != b"[DONE]":
                    result.disconnected += 1
                    response.close()  # hang up mid-stream: the server must abort and free the request
                    return
        _judge_stream(result, events, kind)


def _judge_status(result: SoakResult, status: int, raw: bytes, expected: int, kind: str) -> None:
    result.rejected[str(status)] = result.rejected.get(str(status), 0) + 1
    try:
        error = json.loads(raw)["error"]
        well_formed = set(error) == {"message", "type", "param", "code"}
    except (ValueError, KeyError, TypeError):
        well_formed = False
    if status >= 500 or not well_formed:
        result.note("lost", f"{kind}: {status} {raw[:300]!r}")
    elif status != expected:
        result.note("unexpected", f"{kind}: {status} (expected {expected}) {raw[:300]!r}")


def _judge_json(result: SoakResult, raw: bytes, n: int, kind: str) -> None:
    try:
        answer = json.loads(raw)
        ok = len(answer["choices"]) == n and answer["usage"]["completion_tokens"] >= 1
    except (ValueError, KeyError, TypeError):
        ok = False
    if ok:
        result.succeeded += 1
    else:
        result.note("lost", f"{kind}: {raw[:300]!r}")


def _judge_stream(result: SoakResult, events: list[bytes], kind: str) -> None:
    try:
        chunks = [json.loads(e) for e in events[:-1]]
        ok = events[-1] == b"[DONE]" and all("choices" in c for c in chunks) and any(
            ch.get("finish_reason") for c in chunks for ch in c["choices"])
    except (ValueError, IndexError, TypeError):
        ok = False
    if ok:
        result.succeeded += 1
    else:
        result.note("lost", f"{kind}: {b' | '.join(events[-3:])[:300]!r}")


async def _send_bad(session: aiohttp.ClientSession, base: str, rng: random.Random, result: SoakResult) -> None:
    kind, path, body, expected = _bad_request(rng)
    result.by_kind[kind] = result.by_kind.get(kind, 0) + 1
    async with session.post(base + path, data=body, headers={"Content-Type": "application/json"}) as response:
        raw = await response.read()
    if response.status == 200:
        result.note("unexpected", f"{kind}: 200 {raw[:200]!r}")
        result.succeeded += 1
    else:
        _judge_status(result, response.status, raw, expected, kind)


async def _client(base: str, deadline: float, rng: random.Random, bad_fraction: float, result: SoakResult) -> None:
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while time.monotonic() < deadline:
            send = _send_bad if rng.random() < bad_fraction else _send_good
            result.sent += 1
            try:
                await send(session, base, rng, result)
            except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                result.note("lost", f"{send.__name__}: {type(exc).__name__}: {exc}")


async def soak(base: str, duration_s: float, concurrency: int = 8, seed: int = 0,
               bad_fraction: float = 0.2, idle_timeout_s: float = 60.0) -> SoakResult:
    """Run the traffic against a server at ``base`` (with ``--max-request-body-bytes`` BODY_LIMIT), then
    wait up to ``idle_timeout_s`` for its gauges to reach 0 and record them."""
    result = SoakResult()
    deadline = time.monotonic() + duration_s
    await asyncio.gather(*(_client(base, deadline, random.Random(seed * 1000 + i), bad_fraction, result)
                           for i in range(concurrency)))
    result.gauges = await _idle_gauges(base, idle_timeout_s)
    return result


async def _idle_gauges(base: str, timeout_s: float) -> dict[str, float | None]:
    """The gauges once all are 0, or as they were when ``timeout_s`` ran out (None: missing)."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            async with session.get(base + "/metrics") as response:
                metrics = parse_metrics(await response.text())
            gauges = {name: metrics.total(name) for name in GAUGES}
            if all(v == 0 for v in gauges.values()) or time.monotonic() > deadline:
                return gauges
            await asyncio.sleep(0.2)


# -- the server process ---------------------------------------------------------------------------------------
def start_server(extra_args: list[str]) -> tuple[subprocess.Popen, str]:
    """`jido serve` on a free loopback port; returns the process and its base URL once it listens. Its log
    goes on to this process's stderr."""
    process = subprocess.Popen([sys.executable, "-m", "jido.cli", "serve", "--host", "127.0.0.1", "--port", "0",
                                "--max-request-body-bytes", str(BODY_LIMIT), *extra_args],
                               stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    for line in process.stderr:
        sys.stderr.write(line)
        match = re.search(r"listening on (http://127\.0\.0\.1:\d+)", line)
        if match:
            # NOTE: the pipe must keep being read, or the server blocks once its log fills it.
            threading.Thread(target=lambda: [sys.stderr.write(rest) for rest in process.stderr], daemon=True).start()
            return process, match.group(1)
    raise RuntimeError(f"jido serve exited with {process.wait()} before listening")


def stop_server(process: subprocess.Popen, timeout_s: float = 120) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()


def _versions() -> dict[str, str]:
    import torch
    import uvicorn

    from jido.utils.cpu import cpu_info
    cpu = cpu_info()
    return {"cpu_model": cpu.model, "num_cpus": str(cpu.num_cpus), "cpu_flags": " ".join(cpu.key_flags),
            "python": platform.python_version(), "torch": torch.__version__, "uvicorn": uvicorn.__version__,
            "aiohttp": aiohttp.__version__, "commit": _git_commit()}


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=600)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bad-fraction", type=float, default=0.2)
    parser.add_argument("--max-model-len", type=int, default=2048, help="the server's; prompts past it are sent too")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    parser.add_argument("serve_args", nargs="*", help="more `jido serve` flags, after --")
    args = parser.parse_args()
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    # Later flags win: serve_args may name another model or template.
    serve_args = ["--max-model-len", str(args.max_model_len), "--chat-template", str(GEMMA_CHAT_TEMPLATE),
                  *args.serve_args]
    process, base = start_server(serve_args)
    begin = time.monotonic()
    try:
        result = asyncio.run(soak(base, args.duration_s, args.concurrency, args.seed, args.bad_fraction))
    finally:
        exit_code = stop_server(process)
    doc = {"date": started, "duration_s": round(time.monotonic() - begin, 1), "machine": _versions(),
           "settings": {"concurrency": args.concurrency, "seed": args.seed, "bad_fraction": args.bad_fraction,
                        "max_request_body_bytes": BODY_LIMIT, "serve_args": serve_args},
           **asdict(result), "server_exit_code": exit_code, "ok": result.ok and exit_code == 0}
    text = json.dumps(doc, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
