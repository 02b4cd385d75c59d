"""jido (지도, "map"): an LLM inference serving engine that measures which optimizations pay."""
from __future__ import annotations

from jido.core.sampling_params import SamplingParams, StructuredOutputsParams

__all__ = ["LLM", "SamplingParams", "StructuredOutputsParams"]


def __getattr__(name: str):
    # LLM pulls in torch and the model code: import it only when asked for, so `jido plan` stays light.
    if name == "LLM":
        from jido.engine.llm import LLM
        return LLM
    raise AttributeError(f"module 'jido' has no attribute {name!r}")
