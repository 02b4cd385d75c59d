"""SIGTERM and SIGINT for a uvicorn server that drains: once it has, they end the process with exit code 0."""
from __future__ import annotations

import logging
import signal
from collections.abc import Iterator
from contextlib import contextmanager

logger = logging.getLogger("jido")
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@contextmanager
def drained_signals_exit_cleanly() -> Iterator[None]:
    """Inside: SIGTERM and SIGINT, which uvicorn re-raises once it has drained, are logged instead of killing
    the process (exit 143 or 130), so a clean drain returns to the caller; the previous handlers come back on
    leaving."""
    previous = {sig: signal.signal(sig, _drained) for sig in _SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _drained(signum: int, frame: object) -> None:
    logger.info("%s: drained, exiting", signal.Signals(signum).name)
