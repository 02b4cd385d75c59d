"""The ``tcp`` KV transport: payloads travel as ZMQ frames of the control message itself."""
from __future__ import annotations

from typing import Any

from jido.kvtransfer.transport import PayloadChannel, TransferError


class FrameChannel(PayloadChannel):
    """One frame per payload; ZMQ sends them without copying and the receiver reads them in place."""

    name = "tcp"

    def pack(self, payloads: list[bytes]) -> tuple[dict[str, Any], list[Any]]:
        return {"num_frames": len(payloads)}, list(payloads)

    def unpack(self, header: dict[str, Any], frames: list[memoryview]) -> list[memoryview]:
        if len(frames) != header.get("num_frames", 0):
            raise TransferError(f"message carries {len(frames)} payload frames, its header says "
                                f"{header.get('num_frames')}")
        return frames
