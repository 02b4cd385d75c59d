"""How the mp executor starts its worker processes: fork where that is safe, else spawn, and why."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import sys
import warnings
from pathlib import Path
from typing import NamedTuple

START_METHOD_ENV = "JIDO_WORKER_MULTIPROC_METHOD"  # debugging switch: fork or spawn, instead of jido's choice
_METHODS = ("fork", "spawn")
_TASKS = Path("/proc/self/task")
_MAPS = Path("/proc/self/maps")


class StartMethod(NamedTuple):
    method: str  # "fork" or "spawn"
    reason: str  # why, for the log


def worker_start_method() -> StartMethod:
    """``fork`` when this process can be forked safely, else ``spawn``; ``JIDO_WORKER_MULTIPROC_METHOD`` overrides.

    Fork starts workers at once and works in a script without an ``if __name__ == "__main__":`` guard, but a
    forked child keeps only the thread that forked: a lock another thread held stays locked in it for good (a
    child of a process whose torch ran an OpenMP region hangs in its first matmul), and a child of a process that
    initialized the CUDA driver cannot initialize it again. Spawn is always safe, and re-runs the main module in
    every worker.

    Raises:
        ValueError: ``JIDO_WORKER_MULTIPROC_METHOD`` is set to something other than ``fork`` or ``spawn``.
    """
    chosen = os.environ.get(START_METHOD_ENV, "")
    if chosen:
        if chosen not in _METHODS:
            raise ValueError(f"{START_METHOD_ENV}={chosen!r}: it must be fork or spawn (or unset: jido picks fork "
                             f"when this process has one thread and has not loaded the CUDA driver, else spawn)")
        return StartMethod(chosen, f"{START_METHOD_ENV}={chosen}")
    # NOTE: a spawned process re-running an unguarded script gets here while it imports the main module, with one
    # thread; forking there would run the whole script in the worker. Python refuses to start processes there
    # (multiprocessing.spawn._check_not_importing_main reads the same flag), so the parent hears of the failure.
    if getattr(mp.current_process(), "_inheriting", False):
        return StartMethod("spawn", "this process is a spawned one still importing its main module")
    if "fork" not in mp.get_all_start_methods():
        return StartMethod("spawn", f"{sys.platform} has no fork")
    if not _TASKS.is_dir():
        return StartMethod("spawn", f"this process's threads cannot be counted ({_TASKS} is missing)")
    if _cuda_driver_loaded():
        return StartMethod("spawn", "this process has loaded the CUDA driver (torch.cuda.is_available() does), and "
                                    "a forked child could not initialize it")
    num_threads = _num_threads()
    if num_threads > 1:
        num_threads = _num_threads_left_by_fork()
    if num_threads > 1:
        return StartMethod("spawn", f"{num_threads - 1} other thread(s) of this process (an OpenMP pool, a Python "
                                    f"thread) would be lost in a forked child, and a lock one held would stay locked")
    return StartMethod("fork", "this process has one thread and has not loaded the CUDA driver")


def _cuda_driver_loaded() -> bool:
    """torch's CUDA initialized, or the driver library mapped: ``torch.cuda.is_available()`` initializes the driver
    (cuInit, through ``cudaGetDeviceCount``) and ``torch.cuda.is_initialized()`` stays False."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return True
    with _MAPS.open(encoding="utf-8", errors="replace") as maps:
        return any("/libcuda.so" in line for line in maps)


def _num_threads() -> int:
    return len(list(_TASKS.iterdir()))


def _num_threads_left_by_fork() -> int:
    """This process's threads right after a fork of it: a pool that stops itself when the process forks, as
    OpenBLAS's does (numpy starts it on import, one thread per extra core), is not counted. Python 3.12's
    warning about forking a threaded process counts at the same moment."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # that warning: this fork's child only exits
        pid = os.fork()
        if pid == 0:
            os._exit(0)
    try:
        return _num_threads()
    finally:
        os.kill(pid, signal.SIGKILL)  # it may be stuck in an after-fork hook on a lock a lost thread held
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:  # reaped by someone else's waitpid(-1)
            pass
