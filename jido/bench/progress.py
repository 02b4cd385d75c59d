"""A one-line progress bar on stderr while requests finish (the bench keeps its dependencies few)."""
from __future__ import annotations

import sys
import time

_WIDTH = 30


class ProgressBar:
    """Redraws `[#####.....] 12/100 req  3.1 req/s  4 failed` in place; silent when disabled."""

    def __init__(self, total: int, label: str = "", disable: bool = False) -> None:
        self.total, self.label, self.disable = total, label, disable
        self.done = self.failed = 0
        self._start = time.perf_counter()

    def update(self, success: bool) -> None:
        self.done += 1
        self.failed += not success
        self._draw()

    def close(self) -> None:
        if not self.disable:
            sys.stderr.write("\n")
            sys.stderr.flush()

    def _draw(self) -> None:
        if self.disable:
            return
        filled = _WIDTH * self.done // max(self.total, 1)
        rate = self.done / max(time.perf_counter() - self._start, 1e-9)
        failed = f"  {self.failed} failed" if self.failed else ""
        sys.stderr.write(f"\r{self.label}[{'#' * filled}{'.' * (_WIDTH - filled)}] "
                         f"{self.done}/{self.total} req  {rate:.2f} req/s{failed}")
        sys.stderr.flush()
