"""w8a8's SmoothQuant smoothing, calibrated once the model is loaded and its KV cache exists.

w8a8 rounds each linear's input to int8 per token. Gemma 3's inputs have outlier channels, and per-token rounding
crushes the other channels under them. SmoothQuant (Xiao et al., 2023) moves part of each channel's range into the
weight, ``x W^T = (x / s)(W s)^T``, ``s`` from the largest ``|x|`` each channel takes on calibration text. vLLM takes
w8a8 checkpoints smoothed offline; jido quantizes at load, so it calibrates at load: a few chunks of text run
through the model on its float weights, each layer's input maxima recorded chunk by chunk, then every layer quantized
again with factors from their mean (``QuantizedLinearMethod.observe_inputs`` / ``smooth``). The mean of the chunks'
maxima, not the overall maximum, because the maximum grows with the text; alpha 0.75 and one alpha for every layer,
because per-layer alphas measured no better (benchmarks/results/smoothquant_emulation-2026-12-05-amx-xeon.json,
benchmarks/results/report-2026-12-05-amx-xeon-w8a8-smoothing.md).

The text is jido's calibration set (``text_domains``, split ``calibration``): one chunk from each domain (English
and Korean prose, Python and C code, chat, numbers and tables), so the scales see every kind of input the held-out
gate scores; the gate's texts are a separate set that calibration never reads.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from jido.attention.backend import AttentionMetadata
from jido.layers.quantized_linear import QuantizedLinearMethod
from jido.models.tokenizer import Tokenizer
from jido.utils.text_domains import DOMAINS, domain_text


ALPHA = 0.75  # the best of 0.5 / 0.65 / 0.75 / 0.85 in the emulation above
CHUNK_TOKENS = 512


def calibration_chunks(tokenizer: Tokenizer, vocab_size: int, max_tokens: int) -> list[list[int]]:
    """A chunk of :data:`CHUNK_TOKENS` token ids (fewer where ``max_tokens`` is smaller) from the start of each
    domain's calibration text, ids outside the model's vocabulary left out."""
    size = max(1, min(CHUNK_TOKENS, max_tokens))
    chunks = []
    for domain in DOMAINS:
        ids = tokenizer.encode(domain_text("calibration", domain), add_special_tokens=False)
        chunks.append([i for i in ids if i < vocab_size][:size])
    return chunks


def pending_layers(model: nn.Module) -> list[nn.Module]:
    """The layers that hold a float source to smooth from (w8a8 layers quantized from float weights)."""
    return [m for m in model.modules()
            if isinstance(getattr(m, "linear_method", None), QuantizedLinearMethod)
            and m.layouts.smoothing_source is not None]


def calibrate(model: nn.Module, forward: Callable[[list[int]], None], chunks: list[list[int]],
              alpha: float = ALPHA) -> list[nn.Module]:
    """Run ``forward`` on each chunk with every pending layer observing its inputs, then smooth them; returns the
    layers smoothed (not those the forward never ran, which keep codes of W itself)."""
    layers = pending_layers(model)
    seen = [layer.linear_method.observe_inputs(layer) for layer in layers]  # each: the maxima of every step
    for chunk in chunks:
        forward(chunk)
    return [layer for layer, maxima in zip(layers, seen) if layer.linear_method.smooth(layer, maxima, alpha)]


def discard(model: nn.Module) -> int:
    """Drop the float sources unsmoothed (where the runner cannot run a calibration forward); returns how many."""
    layers = pending_layers(model)
    for layer in layers:
        layer.layouts.smoothing_source = None
    return len(layers)


def chunk_forward_inputs(chunk: list[int], block_size: int,
                         device: torch.device) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
    """One request's whole prompt as a step: token ids, positions, and its attention metadata (its blocks 0, 1, ...
    in order, so token i goes to slot i)."""
    n = len(chunk)
    num_blocks = -(-n // block_size)
    metadata = AttentionMetadata(query_start_loc=torch.tensor([0, n], dtype=torch.int32, device=device),
                                 seq_lens=torch.tensor([n], dtype=torch.int32, device=device),
                                 block_tables=torch.arange(num_blocks, dtype=torch.int32, device=device)[None],
                                 slot_mapping=torch.arange(n, dtype=torch.int64, device=device), block_size=block_size,
                                 query_lens_list=[n], seq_lens_list=[n])
    return torch.tensor(chunk, device=device), torch.arange(n, device=device), metadata
