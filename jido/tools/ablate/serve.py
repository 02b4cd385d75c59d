"""The `jido serve` processes an ablation runs: the flags this jido's serve has, and one server on loopback."""
from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TextIO

# The `jido` command installed beside this interpreter (a venv's bin/), as a user would run it.
SERVE_COMMAND = (str(Path(sys.executable).with_name("jido")), "serve")
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")
# A flag in argparse's usage line, with its choices when it lists them: "--dtype {auto,float32}".
_USAGE_FLAG = re.compile(r"(--[a-z0-9][a-z0-9-]*)(?: \{([^}]*)\})?")


class ServerStartError(RuntimeError):
    """`jido serve` exited, or did not listen in time; the message is its own last words."""


def serve_options(command: Sequence[str] = SERVE_COMMAND) -> dict[str, tuple[str, ...] | None]:
    """Every flag `jido serve --help` lists in its usage, with its choices (None where any value goes).

    Raises:
        ServerStartError: the command could not print its help.
    """
    # A wide terminal keeps each flag and its choices on one line; no colour codes in the text.
    env = {**os.environ, "COLUMNS": "10000", "NO_COLOR": "1"}
    try:
        done = subprocess.run([*command, "--help"], capture_output=True, text=True, env=env, timeout=300)
    except FileNotFoundError:
        raise ServerStartError(f"no {command[0]}: install jido into this Python's environment "
                               "(pip install -e .) so that its `jido` command sits beside the interpreter") from None
    if done.returncode != 0:
        raise ServerStartError(f"{' '.join(command)} --help exited with {done.returncode}: {done.stderr[-500:]}")
    usage = done.stdout.split("\n\n", 1)[0]
    options: dict[str, tuple[str, ...] | None] = {}
    for flag, choices in _USAGE_FLAG.findall(usage):
        options[flag] = tuple(choices.split(",")) if choices else options.get(flag)
    return options


@contextlib.contextmanager
def serving(serve_args: Sequence[str], log_path: Path, start_timeout_s: float,
            command: Sequence[str] = SERVE_COMMAND) -> Iterator[str]:
    """Run `jido serve SERVE_ARGS` on a free loopback port; yields its base URL once it listens, stops it after.

    Its output goes to ``log_path``. The server runs in a session of its own, so a Ctrl-C meant for the
    ablation reaches it only as the SIGTERM that drains it here.

    Raises:
        ServerStartError: it exited before listening (the message quotes its error) or took longer than
            ``start_timeout_s``.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv = [*command, "--host", "127.0.0.1", "--port", "0", *serve_args]
    with log_path.open("w", encoding="utf-8") as log:
        log.write(" ".join(argv) + "\n")
        log.flush()
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.PIPE, text=True, start_new_session=True)
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(target=_copy_lines, args=(process, log, lines), daemon=True)
        reader.start()
        try:
            yield _wait_for_address(process, lines, start_timeout_s)
        finally:
            stop(process)
            reader.join(10)


def _copy_lines(process: subprocess.Popen, log: TextIO, lines: queue.Queue) -> None:
    # NOTE: the pipe must be read to the end, or the server blocks once its log fills it.
    for line in process.stderr:
        log.write(line)
        log.flush()
        lines.put(line)
    lines.put(None)


def _wait_for_address(process: subprocess.Popen, lines: queue.Queue, timeout_s: float) -> str:
    deadline, seen = time.monotonic() + timeout_s, []
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            raise ServerStartError(f"jido serve exited with {process.wait()} before listening: {_last_words(seen)}")
        seen.append(line)
        match = _LISTENING.search(line)
        if match:
            return match.group(1)
    raise ServerStartError(f"jido serve did not listen within {timeout_s:g} s: {_last_words(seen)}")


def _last_words(lines: list[str]) -> str:
    """The server's own error line when it printed one (`jido: error: ...`), else its last line."""
    errors = [line.strip() for line in lines if line.startswith("jido: error:")]
    rest = [line.strip() for line in lines if line.strip()]
    return (errors or rest or ["(no output)"])[-1]


def stop(process: subprocess.Popen, drain_s: float = 60.0) -> int:
    """SIGTERM (the server drains and exits), then SIGKILL to its whole session if it lingers; its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(drain_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    return process.wait()
