"""MultiprocExecutor: workers in their own processes, each step broadcast to them over pipes."""
from __future__ import annotations

import logging
import multiprocessing as mp
import traceback
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from jido.config import EngineConfig
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput
from jido.executor.abstract import Executor, WorkerError, call_worker

logger = logging.getLogger("jido")
_POLL_S = 0.2  # how often a wait for a worker checks that the worker is still alive
_SHUTDOWN = "__shutdown__"


@dataclass
class _WorkerHandle:
    rank: int
    process: mp.process.BaseProcess
    conn: Connection


class MultiprocExecutor(Executor):
    """Starts ``world_size`` worker processes (spawned: a forked torch can deadlock) and talks to them.

    Every call is sent to every worker (a broadcast over one duplex pipe each: a 128-request decode
    step's round trip costs ~0.6 ms, see docs/architecture.md), and
    every worker answers in order. A worker that exits, or raises, fails the call with
    :class:`WorkerError`; after that the executor stays failed.
    """

    def __init__(self, config: EngineConfig, model_folder: Path) -> None:
        super().__init__(config, model_folder)
        self._failed: str | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jido-executor")
        context = mp.get_context("spawn")
        self.workers = [self._start(context, rank) for rank in range(config.parallel_config.world_size)]
        self._finalizer = weakref.finalize(self, _stop_workers, self.workers, self._pool)
        for worker in self.workers:
            self._receive(worker)  # "ready", or the error that stopped its start

    def _start(self, context: Any, rank: int) -> _WorkerHandle:
        parent, child = context.Pipe()
        process = context.Process(target=worker_main, name=f"jido-worker-{rank}", daemon=True,
                                  args=(self.config, self.model_folder, rank, child, logging.getLogger().level))
        process.start()
        child.close()
        return _WorkerHandle(rank, process, parent)

    def collective_rpc(self, method: str | Callable[..., Any], args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        self.check_health()
        for worker in self.workers:
            self._send(worker, (method, args, kwargs or {}))
        return [self._receive(worker) for worker in self.workers]

    def execute_model(self, scheduler_output: SchedulerOutput,
                      non_block: bool = False) -> ModelRunnerOutput | Future[ModelRunnerOutput]:
        if not non_block:
            return self.collective_rpc("execute_model", (scheduler_output,))[0]
        return self._pool.submit(lambda: self.collective_rpc("execute_model", (scheduler_output,))[0])

    def check_health(self) -> None:
        if self._failed is None:
            for worker in self.workers:
                if not worker.process.is_alive():
                    self._fail(f"worker {worker.rank} (pid {worker.process.pid}) exited with code "
                               f"{worker.process.exitcode}")
        if self._failed is not None:
            raise WorkerError(self._failed)

    def shutdown(self) -> None:
        self._finalizer()

    def _send(self, worker: _WorkerHandle, message: Any) -> None:
        try:
            worker.conn.send(message)
        except (BrokenPipeError, ConnectionResetError, EOFError) as exc:
            worker.process.join(timeout=_POLL_S)
            self.check_health()
            self._fail(f"worker {worker.rank} cannot be reached: {exc!r}")
            raise WorkerError(self._failed) from None

    def _receive(self, worker: _WorkerHandle) -> Any:
        while not worker.conn.poll(_POLL_S):
            if not worker.process.is_alive():
                self.check_health()
        try:
            status, value = worker.conn.recv()
        except (EOFError, ConnectionResetError) as exc:
            worker.process.join(timeout=_POLL_S)  # a pipe closes as its process dies: report the exit code
            self.check_health()
            self._fail(f"worker {worker.rank} closed its pipe: {exc!r}")
            raise WorkerError(self._failed) from None
        if status == "error":
            self._fail(f"worker {worker.rank} failed: {value}")
            raise WorkerError(self._failed)
        return value

    def _fail(self, reason: str) -> None:
        if self._failed is None:
            self._failed = reason
            logger.error("%s", reason)


def worker_main(config: EngineConfig, model_folder: Path, rank: int, conn: Connection, log_level: int) -> None:
    """A worker process: build the Worker, then answer ``(method, args, kwargs)`` calls until told to stop."""
    logging.basicConfig(level=log_level, format=f"%(levelname)s %(name)s[worker {rank}]: %(message)s")
    try:
        from jido.runner.worker import Worker  # imported here: only worker processes load the model code

        worker = Worker(config, model_folder, rank)
        conn.send(("ok", "ready"))
    except Exception:  # noqa: BLE001 - the engine must hear why the start failed
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            message = conn.recv()
        except (EOFError, KeyboardInterrupt):
            return  # the engine went away
        if message == _SHUTDOWN:
            return
        method, args, kwargs = message
        try:
            conn.send(("ok", call_worker(worker, method, args, kwargs)))
        except Exception:  # noqa: BLE001 - report, and let the engine decide
            conn.send(("error", traceback.format_exc()))


def _stop_workers(workers: list[_WorkerHandle], pool: ThreadPoolExecutor) -> None:
    for worker in workers:
        try:
            worker.conn.send(_SHUTDOWN)
        except (BrokenPipeError, ConnectionResetError, EOFError, OSError):
            pass
    for worker in workers:
        worker.process.join(timeout=5)
        if worker.process.is_alive():
            worker.process.kill()
            worker.process.join(timeout=5)
        worker.conn.close()
    pool.shutdown(wait=False)
