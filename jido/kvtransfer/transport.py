"""KV transports: how payload bytes travel beside the KV endpoint's control messages, chosen by ``kv_connector``.

Every transport shares the endpoint's control protocol (:mod:`jido.kvtransfer.endpoint`: small JSON headers
over ZMQ); a :class:`PayloadChannel` decides how the payloads of a message get to the peer: ``tcp`` sends
them as frames of the message itself, ``shm`` writes them into a shared-memory segment both processes map
and sends only its name.
"""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from typing import Any


class TransferError(RuntimeError):
    """A transfer that cannot complete: the peer is gone or refused it, timed out, or its bytes cannot be read."""


class PayloadChannel(ABC):
    """Carries a message's payloads (encoded KV pieces) from a sender to a receiver.

    Contract:
        - :meth:`pack` (sender) returns header fields and frames; the endpoint sends them with the message.
        - :meth:`unpack` (receiver) returns one buffer per payload, in order, valid as long as the caller keeps
          a reference to them; it frees whatever the sender set aside for them (a shared segment's name).
        - :meth:`expire` (sender, from time to time) frees what no receiver took within ``timeout_s``.
        Raises TransferError when payloads cannot be read back (a segment gone, sizes that do not add up).
    """

    name: str

    @abstractmethod
    def pack(self, payloads: list[bytes]) -> tuple[dict[str, Any], list[Any]]: ...

    @abstractmethod
    def unpack(self, header: dict[str, Any], frames: list[memoryview]) -> list[memoryview]: ...

    def expire(self, timeout_s: float) -> None:
        """Free payloads packed longer than ``timeout_s`` ago that no receiver took."""

    def close(self) -> None:
        """Free everything still packed."""


# transport name -> (module, class); imported when an instance uses it
CHANNELS: dict[str, tuple[str, str]] = {
    "tcp": ("jido.kvtransfer.transport_tcp", "FrameChannel"),
    "shm": ("jido.kvtransfer.transport_shm", "SharedMemoryChannel"),
}


def make_channel(name: str) -> PayloadChannel:
    """The payload channel of transport ``name``; raises ValueError for one jido does not have."""
    if name not in CHANNELS:
        raise ValueError(f"unknown KV transport {name!r}; available: {sorted(CHANNELS)}")
    module, cls = CHANNELS[name]
    return getattr(importlib.import_module(module), cls)()


def split_sizes(buffer: memoryview, sizes: list[int]) -> list[memoryview]:
    """``buffer`` cut into consecutive pieces of ``sizes`` bytes; raises TransferError if they do not add up."""
    if sum(sizes) != len(buffer):
        raise TransferError(f"payload of {len(buffer)} bytes does not hold the {sum(sizes)} bytes its header lists")
    pieces, offset = [], 0
    for size in sizes:
        pieces.append(buffer[offset:offset + size])
        offset += size
    return pieces
