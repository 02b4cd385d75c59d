"""The ``shm`` KV transport: payloads go into a shared-memory segment (a file in /dev/shm) that both instances map.

The sender copies the payloads into a fresh segment and sends its name and the payload sizes; the receiver
maps it, removes its name at once (the mapping stays valid until its last view goes) and reads the payloads
in place. Segments a receiver never took are removed by the sender after a timeout, so a consumer that
dies leaks nothing.
"""
from __future__ import annotations

import atexit
import mmap
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from jido.kvtransfer.transport import PayloadChannel, TransferError, split_sizes

SHM_DIR = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
PREFIX = "jido-kv-"


class SharedMemoryChannel(PayloadChannel):
    name = "shm"

    def __init__(self) -> None:
        self._packed: dict[Path, float] = {}  # segment -> when it was packed
        self._lock = threading.Lock()
        atexit.register(self.close)  # a process that exits leaves no segment behind

    def pack(self, payloads: list[bytes]) -> tuple[dict[str, Any], list[Any]]:
        sizes = [len(p) for p in payloads]
        path = SHM_DIR / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
        with open(path, "w+b") as file:
            total = sum(sizes)
            if total:
                file.truncate(total)
                with mmap.mmap(file.fileno(), total) as segment:
                    offset = 0
                    for payload in payloads:
                        segment[offset:offset + len(payload)] = payload
                        offset += len(payload)
        with self._lock:
            self._packed[path] = time.monotonic()
        return {"segment": path.name, "sizes": sizes}, []

    def unpack(self, header: dict[str, Any], frames: list[memoryview]) -> list[memoryview]:
        name, sizes = header.get("segment"), header.get("sizes")
        if not isinstance(name, str) or not name.startswith(PREFIX) or "/" in name or not isinstance(sizes, list):
            raise TransferError(f"shm message names no valid segment ({name!r})")
        path = SHM_DIR / name
        try:
            with open(path, "rb") as file:
                total = os.fstat(file.fileno()).st_size
                view = memoryview(mmap.mmap(file.fileno(), total, access=mmap.ACCESS_READ)) if total else memoryview(b"")
            path.unlink(missing_ok=True)
        except OSError as exc:
            raise TransferError(f"shared-memory segment {name} cannot be read: {exc}") from None
        return split_sizes(view, sizes)

    def expire(self, timeout_s: float) -> None:
        now = time.monotonic()
        with self._lock:
            old = [p for p, t in self._packed.items() if now - t > timeout_s]
            for path in old:
                del self._packed[path]
        for path in old:
            path.unlink(missing_ok=True)

    def close(self) -> None:
        self.expire(-1.0)
        atexit.unregister(self.close)
