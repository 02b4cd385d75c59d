"""A fake OpenAI-compatible server on 127.0.0.1 that streams tokens on a schedule the prompt dictates."""
from __future__ import annotations

import contextlib
import json
import re
import socket
import struct
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# Each completed request adds these to the fake server's vLLM-style counters.
PREFIX_QUERIES_PER_REQUEST, PREFIX_HITS_PER_REQUEST = 100, 25
QUEUE_SECONDS_PER_REQUEST = 0.010
# Speculative decoding per request: 3 drafts of 3 proposals, 6 accepted (3 at position 0, 2 at 1, 1 at 2).
SPEC_ACCEPTED_PER_POS_PER_REQUEST = (3, 2, 1)
KV_USAGE = 0.5
STEP_REQUESTS_PER_REQUEST, STEPS_PER_REQUEST = 3, 2  # jido:step_num_requests: 1.5 requests per step


class FakeState:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.num_requests = 0
        self.payloads: list[dict] = []
        self.num_connections_to_drop = 0  # POSTs answered by closing the connection, as a stale keep-alive
        # POSTs that get a reset before their body is read, as from a server whose keep-alive timeout fired
        # just as the client reused the connection: the write fails, or the server is gone before answering.
        self.num_kept_alive_to_reset = 0
        self.num_resets = 0
        self.num_scrapes_started = 0
        self.metrics_delay_s = 0.0  # how long /metrics takes to answer


def schedule(prompt: str) -> tuple[float, float]:
    """'ttft_ms=50 itl_ms=10' -> (0.05, 0.01): when the first token comes, and the gap between the next."""
    ttft = float(re.search(r"ttft_ms=(\d+)", prompt).group(1)) / 1000 if "ttft_ms=" in prompt else 0.0
    itl = float(re.search(r"itl_ms=(\d+)", prompt).group(1)) / 1000 if "itl_ms=" in prompt else 0.0
    return ttft, itl


def make_handler(state: FakeState) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keeps connections alive between requests, as real servers do

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._send(200, "application/json", json.dumps({"data": [{"id": "fake-model", "owned_by": "t"}]}))
            elif self.path == "/metrics":
                with state.lock:
                    state.num_scrapes_started += 1
                time.sleep(state.metrics_delay_s)
                self._send(200, "text/plain", self._metrics_text())
            else:
                self._send(404, "application/json", json.dumps({"error": {"message": "not found"}}))

        def do_POST(self) -> None:
            with state.lock:
                # After the first answer (the bench's warm-up), so the resets land on the timed requests.
                reset = state.num_requests > 0 and state.num_kept_alive_to_reset > 0
                state.num_kept_alive_to_reset -= reset
                state.num_resets += reset
            if reset:
                # Linger 0: close() sends RST at once instead of FIN, and the unread body is dropped.
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                self.close_connection = True
                return
            payload = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path not in ("/v1/completions", "/v1/chat/completions"):  # no /tokenize, as llama-server
                self._send(404, "application/json", json.dumps({"error": {"message": "not found"}}))
                return
            with state.lock:
                state.payloads.append(payload)
                drop = state.num_connections_to_drop > 0
                state.num_connections_to_drop -= drop
            if drop:
                self.close_connection = True
                return
            prompt = payload.get("prompt") or payload["messages"][-1]["content"]
            if "fail" in prompt:
                self._send(500, "application/json", json.dumps({"error": {"message": "asked to fail"}}))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            self._stream(payload, prompt)
            with state.lock:  # counted before the body ends, as a server counts a request finished before its last
                state.num_requests += 1  # bytes go out: a client that scrapes /metrics right after must see it
            self._chunk(b"")

        def _stream(self, payload: dict, prompt: str) -> None:
            chat = "messages" in payload
            ttft, itl = schedule(prompt)
            if chat:  # a role-only first chunk, as OpenAI sends: it must not count as the first token
                self._event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
            for i in range(payload["max_tokens"]):
                time.sleep(ttft if i == 0 else itl)
                text = f" tok{i}"
                choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
                self._event({"choices": [choice]})
            self._event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": payload["max_tokens"]}})
            self._chunk(b"data: [DONE]\n\n")

        def _event(self, body: dict) -> None:
            self._chunk(f"data: {json.dumps(body)}\n\n".encode())

        def _chunk(self, data: bytes) -> None:
            """One piece of a chunked body; empty ends the body."""
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _metrics_text(self) -> str:
            n = state.num_requests
            return "\n".join([
                "# TYPE vllm:prefix_cache_queries counter",
                f'vllm:prefix_cache_queries_total{{model_name="fake-model"}} {n * PREFIX_QUERIES_PER_REQUEST}',
                f'vllm:prefix_cache_hits_total{{model_name="fake-model"}} {n * PREFIX_HITS_PER_REQUEST}',
                f'vllm:request_queue_time_seconds_sum{{model_name="fake-model"}} {n * QUEUE_SECONDS_PER_REQUEST}',
                f'vllm:request_queue_time_seconds_count{{model_name="fake-model"}} {n}',
                f'vllm:kv_cache_usage_perc{{model_name="fake-model"}} {KV_USAGE}',
                'vllm:num_requests_running{model_name="fake-model"} 1',
                f'jido:step_num_requests_sum{{model_name="fake-model"}} {n * STEP_REQUESTS_PER_REQUEST}',
                f'jido:step_num_requests_count{{model_name="fake-model"}} {n * STEPS_PER_REQUEST}',
                f'vllm:spec_decode_num_drafts_total{{model_name="fake-model"}} {n * 3}',
                f'vllm:spec_decode_num_draft_tokens_total{{model_name="fake-model"}} {n * 9}',
                f'vllm:spec_decode_num_accepted_tokens_total{{model_name="fake-model"}} {n * 6}',
                *(f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="fake-model",position="{pos}"}} '
                  f'{n * count}' for pos, count in enumerate(SPEC_ACCEPTED_PER_POS_PER_REQUEST)),
                "",
            ])

        def _send(self, status: int, content_type: str, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@contextlib.contextmanager
def fake_server_running(state: FakeState) -> Iterator[str]:
    """The fake server on a free loopback port: yields its base URL, shuts it down after."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(state))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
