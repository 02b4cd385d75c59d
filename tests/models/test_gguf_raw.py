"""GGUF tensors handed through still quantized: bytes, type and HF layout, and what they dequantize to."""
from __future__ import annotations

from pathlib import Path

import gguf as gguf_lib
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize
from tiny_gguf import llama_cpp_permute, write_and_close

from jido.models import gguf

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, HIDDEN = 2, 1, 4, 64
CONFIG = {"num_attention_heads": NUM_HEADS, "num_key_value_heads": NUM_KV_HEADS}


def _write_gguf(path: Path, arch: str, tensors: dict[str, tuple[np.ndarray, Q]]) -> gguf.GGUFFile:
    """Write float32 ``tensors`` (HF row order, as llama.cpp gets them) encoded in the given GGML types."""
    writer = gguf_lib.GGUFWriter(str(path), arch)
    for name, (values, qtype) in tensors.items():
        writer.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)
    write_and_close(writer)
    return gguf.open_gguf(path)


def _random(*shape: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_quantized_tensors_round_trip_as_bytes_in_hf_row_order(tmp_path: Path) -> None:
    q_proj, down = _random(NUM_HEADS * HEAD_DIM, HIDDEN, seed=0), _random(HIDDEN, 32, seed=1)
    norm = _random(HIDDEN, seed=2)
    model = _write_gguf(tmp_path / "tiny.gguf", "llama", {
        "blk.0.attn_q.weight": (llama_cpp_permute(q_proj, NUM_HEADS), Q.Q8_0),
        "blk.0.ffn_down.weight": (down, Q.Q8_0),
        "blk.0.attn_norm.weight": (norm, Q.F32),
    })
    raw = {t.name: t for t in gguf.iter_raw_tensors(model, CONFIG)}
    expected = {
        "model.layers.0.self_attn.q_proj.weight": (quantize(q_proj, Q.Q8_0), Q.Q8_0, (8, HIDDEN)),
        "model.layers.0.mlp.down_proj.weight": (quantize(down, Q.Q8_0), Q.Q8_0, (HIDDEN, 32)),
        "model.layers.0.input_layernorm.weight": (norm.view(np.uint8), Q.F32, (HIDDEN,)),
    }
    assert raw.keys() == expected.keys()
    for name, (data, qtype, shape) in expected.items():
        assert (raw[name].data.dtype, raw[name].data.tobytes()) == (np.uint8, data.tobytes()), name
        assert (raw[name].tensor_type, raw[name].shape) == (qtype, shape), name


def test_dequantized_raw_tensors_equal_the_dequantizing_path(tmp_path: Path) -> None:
    k_proj, up = _random(NUM_KV_HEADS * HEAD_DIM, HIDDEN, seed=3), _random(32, HIDDEN, seed=4)
    model = _write_gguf(tmp_path / "tiny.gguf", "llama", {
        "blk.0.attn_k.weight": (llama_cpp_permute(k_proj, NUM_KV_HEADS), Q.Q8_0),
        "blk.0.ffn_up.weight": (up, Q.Q8_0),
    })
    dequantized = dict(gguf.iter_hf_tensors(model, CONFIG))
    for raw in gguf.iter_raw_tensors(model, CONFIG):
        assert np.array_equal(raw.dequantize(), dequantized[raw.name]), raw.name
    # and both equal the HF weights quantized and dequantized row by row, in HF order
    expected_k = dequantize(quantize(k_proj, Q.Q8_0), Q.Q8_0)
    assert np.array_equal(dequantized["model.layers.0.self_attn.k_proj.weight"], expected_k)


def test_gemma_norms_become_float32_without_the_plus_one(tmp_path: Path) -> None:
    norm, gate = _random(HIDDEN, seed=5), _random(32, HIDDEN, seed=6)
    model = _write_gguf(tmp_path / "gemma.gguf", "gemma3", {
        "blk.0.post_ffw_norm.weight": (norm + np.float32(1.0), Q.F32),
        "blk.0.ffn_gate.weight": (gate, Q.Q8_0),
    })
    raw = {t.name: t for t in gguf.iter_raw_tensors(model, CONFIG)}
    norm_raw = raw["model.layers.0.post_feedforward_layernorm.weight"]
    assert norm_raw.tensor_type == Q.F32
    assert np.array_equal(norm_raw.dequantize(), (norm + np.float32(1.0)) - np.float32(1.0))
    gate_raw = raw["model.layers.0.mlp.gate_proj.weight"]
    assert (gate_raw.tensor_type, gate_raw.data.tobytes()) == (Q.Q8_0, quantize(gate, Q.Q8_0).tobytes())

