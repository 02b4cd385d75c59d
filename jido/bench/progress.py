"""The progress bar on stderr while requests finish: tqdm, with the failures counted beside it."""
from __future__ import annotations

import sys
from typing import TextIO

from tqdm import tqdm


class ProgressBar:
    """`rate=4.0 concurrency=inf:  12%|██  | 12/100 [00:03<00:22, 3.10req/s, failed=4]`.

    Off with ``disable`` (--disable-tqdm) and whenever ``file`` is not a terminal, so logs and pipes get
    the result alone.
    """

    def __init__(self, total: int, label: str = "", disable: bool = False, file: TextIO | None = None) -> None:
        # tqdm's disable=None means "off unless the file is a terminal".
        self._bar = tqdm(total=total, desc=label or None, unit="req", file=file or sys.stderr,
                         disable=True if disable else None, dynamic_ncols=True)
        self.failed = 0

    def update(self, success: bool) -> None:
        if not success:
            self.failed += 1
            self._bar.set_postfix(failed=self.failed, refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()
