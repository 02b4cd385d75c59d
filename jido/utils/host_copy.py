"""Host arrays onto the step's device without waiting: the one way a step's inputs reach a GPU."""
from __future__ import annotations

import numpy as np
import torch


def to_device(array: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """``array`` as a tensor on ``device``: the array's own memory on a CPU; on CUDA a copy staged in pinned memory
    and sent asynchronously.

    A copy from pageable memory makes the host wait for the GPU: a CUDA-graph decode step made ~20 of them in
    preparing its inputs, each a stream synchronization (benchmarks/results/gpu_session-2026-12-04-h200.md).
    Pinned memory comes from PyTorch's caching host allocator, which
    keeps each buffer until the copy out of it has run, so the array may change as soon as this returns.
    """
    tensor = torch.from_numpy(array)
    device = torch.device(device)
    if device.type != "cuda":
        return tensor if device.type == "cpu" else tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)
