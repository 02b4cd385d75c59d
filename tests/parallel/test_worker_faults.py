"""A killed tensor-parallel worker: in-flight requests end with an error naming it, /health turns 503, and
`jido serve` exits with code 1 (for its supervisor to restart it); nothing hangs."""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading

import pytest

from jido import LLM
from server_harness import running_server, wait_until
from test_serve_sigterm import _post, _wait_for_port

pytestmark = pytest.mark.slow


def worker_pid(worker: object) -> int:
    return os.getpid()


def test_health_reports_a_dead_rank_as_unhealthy(family_folder):
    llm = LLM(str(family_folder("llama")), dtype="float32", kv_cache_memory="4MiB", tensor_parallel_size=2)
    try:
        with running_server(engine=llm.llm_engine) as server:
            assert server.request("GET", "/health")[0] == 200
            os.kill(llm.collective_rpc(worker_pid)[1], signal.SIGKILL)
            status, _, body = wait_until(lambda: (r := server.request("GET", "/health"))[0] == 503 and r, 30,
                                         "/health to report the dead worker")
            assert "worker 1 (pid" in json.loads(body)["error"]["message"]
            assert "exited with code -9" in json.loads(body)["error"]["message"]
    finally:
        llm.shutdown()


def test_a_worker_killed_mid_stream_ends_the_stream_with_an_error_and_the_server_exits_1(family_folder):
    process = subprocess.Popen(
        [sys.executable, "-m", "jido.cli", "serve", "--model", str(family_folder("llama")), "--port", "0",
         "--dtype", "float32", "--kv-cache-memory", "4MiB", "--tensor-parallel-size", "2"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in process.stderr], daemon=True).start()
    try:
        port, _ = _wait_for_port(lines, 120)
        _, response = _post(port, {"prompt": [2, 5, 9], "max_tokens": 200, "temperature": 0, "ignore_eos": True,
                                   "stream": True})
        assert response.status == 200
        first = response.readline()  # the first event: generation is under way
        assert first.startswith(b"data: ")
        os.kill(_worker_pids(process.pid)[-1], signal.SIGKILL)
        rest = response.read().decode()
        assert "exited with code -9" in rest and rest.rstrip().endswith("data: [DONE]")
        assert process.wait(timeout=60) == 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _worker_pids(parent: int) -> list[int]:
    """The worker processes of ``parent``: its children, forked or spawned, but multiprocessing's resource tracker
    (which spawning starts)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat, open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                ppid, args = int(stat.read().rsplit(")", 1)[1].split()[1]), cmdline.read()
        except OSError:
            continue
        if ppid == parent and b"resource_tracker" not in args:
            pids.append(int(entry))
    assert len(pids) == 2, f"expected the server's two workers, found {pids}"
    return sorted(pids)
