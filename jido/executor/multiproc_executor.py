"""MultiprocExecutor: workers in their own processes, each step broadcast to them over pipes."""
from __future__ import annotations

import logging
import multiprocessing as mp
import os
import socket
import sys
import traceback
import weakref
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

from jido.config import EngineConfig
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput
from jido.executor.abstract import Executor, WorkerError, call_worker
from jido.executor.start_method import START_METHOD_ENV, worker_start_method

logger = logging.getLogger("jido")
_POLL_S = 0.2  # how often a wait for a worker checks that the worker is still alive
_SHUTDOWN = "__shutdown__"
_PEER_EXIT_WAIT_S = 2.0  # how long a worker's error waits to see whether a peer's death caused it


@dataclass
class _WorkerHandle:
    rank: int
    process: mp.process.BaseProcess
    conn: Connection


class MultiprocExecutor(Executor):
    """Starts ``world_size`` worker processes (forked where that is safe, else spawned: see
    :func:`worker_start_method`) and talks to them.

    Every call is pickled once and sent to every worker (a broadcast over one duplex pipe each: a 128-request
    decode step's round trip is small beside the step, see docs/architecture.md), so a step's inputs reach each rank
    once; every worker answers in order. Workers of a tensor- or pipeline-parallel model form their process
    group at a free port on 127.0.0.1 and split this machine's cores between them. A worker that exits, or
    raises, fails the call with :class:`WorkerError`, and the others (which would wait on it in a collective)
    are stopped; after that the executor stays failed.
    """

    def __init__(self, config: EngineConfig, model_folder: Path) -> None:
        super().__init__(config, model_folder)
        self._failed: str | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jido-executor")
        method, reason = worker_start_method()
        parallel = config.parallel_config
        logger.info("starting %d worker process(es) with %s: %s", parallel.world_size, method, reason)
        context = mp.get_context(method)
        init_method = f"tcp://127.0.0.1:{free_port()}" if parallel.world_size > 1 else None
        threads = threads_per_worker(parallel.world_size * parallel.data_parallel_size)
        self.workers: list[_WorkerHandle] = []
        for rank in range(parallel.world_size):
            self.workers.append(self._start(context, rank, init_method, threads))
        self._finalizer = weakref.finalize(self, _stop_workers, self.workers, self._pool)
        try:
            for worker in self.workers:
                self._receive(worker)  # "ready", or the error that stopped its start
        except WorkerError as exc:
            main = getattr(sys.modules.get("__main__"), "__file__", None)  # what a spawned worker re-runs first
            if method == "spawn" and main and any(w.process.exitcode == 1 for w in self.workers):
                raise WorkerError(_main_module_failed(exc, main)) from None
            raise

    def _start(self, context: Any, rank: int, init_method: str | None, threads: int) -> _WorkerHandle:
        parent, child = context.Pipe()
        args = (self.config, self.model_folder, rank, child, logging.getLogger().level, init_method, threads)
        if context.get_start_method() == "fork":
            # A forked worker inherits the engine's ends of its own pipe and of the workers before it; holding them,
            # it would never read EOF when the engine dies, and would outlive it for good.
            inherited = [parent, *(worker.conn for worker in self.workers)]
            process = context.Process(target=_forked_worker_main, name=f"jido-worker-{rank}", daemon=True,
                                      args=(inherited, *args))
        else:
            process = context.Process(target=worker_main, name=f"jido-worker-{rank}", daemon=True, args=args)
        process.start()
        child.close()
        return _WorkerHandle(rank, process, parent)

    def collective_rpc(self, method: str | Callable[..., Any], args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        self.check_health()
        payload = ForkingPickler.dumps((method, args, kwargs or {}))
        for worker in self.workers:
            self._send(worker, payload)
        return [self._receive(worker) for worker in self.workers]

    def execute_model(self, scheduler_output: SchedulerOutput,
                      non_block: bool = False) -> ModelRunnerOutput | Future[ModelRunnerOutput]:
        return self._execute_on_every_rank(scheduler_output, non_block, self._pool)

    def check_health(self) -> None:
        if self._failed is None:
            for worker in self.workers:
                if not worker.process.is_alive():
                    self._fail(_exited(worker))
        if self._failed is not None:
            raise WorkerError(self._failed)

    def shutdown(self) -> None:
        self._finalizer()

    def _send(self, worker: _WorkerHandle, payload: bytes) -> None:
        try:
            worker.conn.send_bytes(payload)
        except (BrokenPipeError, ConnectionResetError, EOFError) as exc:
            worker.process.join(timeout=_POLL_S)
            self.check_health()
            self._fail(f"worker {worker.rank} cannot be reached: {exc!r}")
            raise WorkerError(self._failed) from None

    def _receive(self, worker: _WorkerHandle) -> Any:
        while not worker.conn.poll(_POLL_S):
            self.check_health()  # any worker: the one we wait for may be blocked on a dead peer
        try:
            status, value = worker.conn.recv()
        except (EOFError, ConnectionResetError) as exc:
            worker.process.join(timeout=_POLL_S)  # a pipe closes as its process dies: report the exit code
            self.check_health()
            self._fail(f"worker {worker.rank} closed its pipe: {exc!r}")
            raise WorkerError(self._failed) from None
        if status == "error":
            # A collective fails on the survivors when a peer dies: name the dead worker as the cause. Not a worker
            # that returned after reporting its own error (it exits with 0; a failed start does that on every rank).
            peers = [w for w in self.workers if w is not worker]
            wait([w.process.sentinel for w in peers], timeout=_PEER_EXIT_WAIT_S)
            for peer in peers:
                if not peer.process.is_alive() and peer.process.exitcode != 0:
                    self._fail(_exited(peer))
            self._fail(f"worker {worker.rank} failed: {value}")
            raise WorkerError(self._failed)
        return value

    def _fail(self, reason: str) -> None:
        if self._failed is None:
            self._failed = reason
            logger.error("%s", reason)
            for worker in self.workers:  # the survivors cannot go on without it: stop them now
                if worker.process.is_alive():
                    worker.process.kill()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now (the rendezvous binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def _exited(worker: _WorkerHandle) -> str:
    return f"worker {worker.rank} (pid {worker.process.pid}) exited with code {worker.process.exitcode}"


def _main_module_failed(exc: WorkerError, main: str) -> str:
    """Why a spawned worker exits with code 1 before it is ready: it re-runs the main module first, and that
    failed; most often because the script creates the engine at its top level, where Python refuses to start
    processes from a process still importing its main module."""
    return (f"{exc} before it was ready. A spawned worker first re-runs the main module ({main}) and that failed "
            f"(its traceback is above): a script that creates the engine at its top level must do it under "
            f'`if __name__ == "__main__":`, or set {START_METHOD_ENV}=fork if you know forking this process is safe '
            f"(one thread, CUDA driver not loaded)")


def threads_per_worker(num_workers: int) -> int:
    """This machine's cores shared out between the workers it runs, one at least each."""
    return max(1, len(os.sched_getaffinity(0)) // num_workers)


def worker_main(config: EngineConfig, model_folder: Path, rank: int, conn: Connection, log_level: int,
                init_method: str | None = None, num_threads: int | None = None) -> None:
    """A worker process: build the Worker, then answer ``(method, args, kwargs)`` calls until told to stop."""
    # force: a forked worker inherits the engine's handlers, and its lines must still name the rank
    logging.basicConfig(level=log_level, format=f"%(levelname)s %(name)s[worker {rank}]: %(message)s", force=True)
    try:
        from jido.runner.worker import Worker  # imported here: only worker processes load the model code

        worker = Worker(config, model_folder, rank, init_method, num_threads)
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
            worker.shutdown()
            return
        method, args, kwargs = message
        try:
            conn.send(("ok", call_worker(worker, method, args, kwargs)))
        except Exception:  # noqa: BLE001 - report, and let the engine decide
            conn.send(("error", traceback.format_exc()))


def _forked_worker_main(inherited: list[Connection], *args: Any) -> None:
    """:func:`worker_main` in a forked process, once it has closed the engine's connections it inherited."""
    for conn in inherited:
        conn.close()
    worker_main(*args)


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
