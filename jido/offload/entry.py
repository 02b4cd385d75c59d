"""The format of one stored KV entry: a header naming the model fingerprint and codec, a checksum, the payload."""
from __future__ import annotations

import struct
import zlib

MAGIC = b"JKV1"
# magic, fingerprint (16 bytes), codec name (8 bytes, NUL-padded), payload length, crc32 of the payload
_HEADER = struct.Struct("<4s16s8sQI")


class CorruptEntryError(ValueError):
    """A stored entry failed its checks (truncated, another model's, or its checksum does not match)."""


def pack_entry(fingerprint: bytes, codec: str, payload: bytes) -> bytes:
    """The bytes to store for ``payload`` encoded with ``codec`` by a model of ``fingerprint`` (16 bytes)."""
    return _HEADER.pack(MAGIC, fingerprint, codec.encode(), len(payload), zlib.crc32(payload)) + payload


def unpack_entry(data: bytes, fingerprint: bytes) -> tuple[str, memoryview]:
    """The codec and payload of a stored entry.

    Raises:
        CorruptEntryError: the entry is truncated, was written for another fingerprint, or its payload's
            checksum differs from the one it was stored with.
    """
    if len(data) < _HEADER.size:
        raise CorruptEntryError(f"entry of {len(data)} bytes is shorter than its {_HEADER.size}-byte header")
    magic, stored_fingerprint, codec, length, checksum = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CorruptEntryError(f"entry starts with {magic!r}, not {MAGIC!r}")
    if stored_fingerprint != fingerprint:
        raise CorruptEntryError("entry was written for another model, dtype, KV layout or block size")
    payload = memoryview(data)[_HEADER.size:]
    if len(payload) != length:
        raise CorruptEntryError(f"entry payload has {len(payload)} bytes, its header says {length}")
    if zlib.crc32(payload) != checksum:
        raise CorruptEntryError("entry checksum mismatch: the stored bytes changed since they were written")
    return codec.rstrip(b"\0").decode(), payload

