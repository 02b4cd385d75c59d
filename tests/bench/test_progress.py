"""The bench's progress bar: tqdm on a terminal, counting failures; nothing at all on a pipe or when disabled."""
from __future__ import annotations

import io

from jido.bench.progress import ProgressBar


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _run(file: io.StringIO, disable: bool = False) -> str:
    bar = ProgressBar(3, label="rate=inf concurrency=2", disable=disable, file=file)
    for success in (True, False, True):
        bar.update(success)
    bar.close()
    return file.getvalue()


def test_bar_on_a_terminal_shows_the_load_the_count_and_the_failures():
    final = _run(_Terminal()).split("\r")[-1]
    assert final.startswith("rate=inf concurrency=2: 100%")
    assert "3/3 [" in final and "req/s, failed=1]" in final and final.endswith("\n")


def test_bar_stays_silent_on_a_pipe_and_when_disabled():
    assert _run(io.StringIO()) == ""
    assert _run(_Terminal(), disable=True) == ""
