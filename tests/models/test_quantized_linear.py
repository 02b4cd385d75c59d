"""Quantized schemes compute with exactly the weights they store: int8/int4 made at load, GGUF codes as stored."""
from __future__ import annotations

import types
import typing
from pathlib import Path

import gguf as gguf_lib
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize
from tiny_gguf import llama_cpp_permute, write_and_close
from tiny_hf_models import tiny_models
from tiny_paged_batch import TinyPagedRunner

from jido.config.model import Quantization
from jido.engine.llm import LLM
from jido.core.sampling_params import SamplingParams
from jido.layers import int8_dot, quant_kernels, quantized_linear
from jido.layers.quantization import QUANTIZATIONS, get_quantization_config, process_weights_after_loading
from jido.layers.quant_kernels import QuantizedWeight
from jido.layers.quantized_layouts import layouts_of
from jido.layers.quantized_linear import QuantizedCodes, merge_codes
from jido.models.loader import iter_gguf_weights
from jido.models.named import CACHE_DIR_ENV
from jido.runner.model_loading import resolve_quantization, weight_bytes
from jido.utils import huge_pages
from jido.utils.cpu import CpuInfo

# A prefill of 20 rows; the layers run every step of two rows or more on their prepacked panels, and a decode
# step of one row on the rows kernel.
TOKENS = {"a": [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], "b": [2, 7, 1, 8, 2, 8, 1, 8]}
SCHEMES = [("int8", None), ("int8", 16), ("int4", None), ("int4", 64), ("w8a8", None)]


def _holding(model: torch.nn.Module, layout: str) -> list[torch.nn.Module]:
    """The model's quantized layers that hold ``layout`` (a field of their QuantizedLayouts)."""
    return [m for m in model.modules() if layouts_of(m) is not None and getattr(m.layouts, layout) is not None]


@pytest.fixture
def exact_x(monkeypatch):
    """The quantized layers multiply x as it is (quant_kernels), as where the int8 dot kernels do not run."""
    monkeypatch.setattr(int8_dot, "runs", lambda w: False)


def _quantized_and_reference(arch: str, scheme: str, group_size: int | None):
    """(our model quantized by ``scheme``, the dense model holding exactly the dequantized weights)."""
    hf, dense = tiny_models(arch)
    quantized = type(dense)(dense.config, dense.model.layers[0].self_attn.backend,
                            quant_config=get_quantization_config(scheme, group_size)).eval()
    quantized.load_weights(hf.state_dict().items())
    process_weights_after_loading(quantized)
    modules = dict(quantized.named_modules())
    for name, module in dense.named_modules():
        qweight = getattr(modules[name], "qweight", None)
        if qweight is not None:
            module.weight.data = quant_kernels.dequantize(qweight)
    return quantized, dense


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("scheme, group_size", [("int8", None), ("int8", 16), ("int4", None), ("int4", 16)])
def test_quantized_model_on_exact_x_equals_the_dense_model_on_its_dequantized_weights(arch, scheme, group_size,
                                                                                     exact_x):
    quantized, reference = _quantized_and_reference(arch, scheme, group_size)
    ours, expected = TinyPagedRunner(quantized).step(TOKENS), TinyPagedRunner(reference).step(TOKENS)
    for request in TOKENS:
        torch.testing.assert_close(ours[request], expected[request], atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("scheme, group_size", SCHEMES)
def test_quantized_steps_run_the_int8_dot_kernels_and_stay_near_the_dense_model(arch, scheme, group_size,
                                                                                 monkeypatch):
    # Every step runs the int8 dot kernels, which round x to int8 per block of 32 (per token under w8a8): the
    # prefill and a decode step of two rows on each layer's prepacked panels, a decode step of one row on the
    # rows kernel. Every call must equal the kernels' float64 reference on its own input (a whole-model
    # comparison cannot be tight: a last-bit change upstream moves a code across a rounding boundary), and the
    # logits stay near the dense model's (a random tiny model compounds the rounding to a few percent of its
    # logits; a wrong group, nibble or sign would be far off).
    steps = (TOKENS, {"a": [7], "b": [4]}, {"a": [1]})  # a prefill, then decode steps of two rows and of one
    quantized, dense = _quantized_and_reference(arch, scheme, group_size)
    weights = {id(m.layouts.panels): m.qweight for m in _holding(quantized, "panels")}
    rows_kernel, panel_kernel, calls = int8_dot.int8_dot_linear, int8_dot.panel_linear, []

    def check(kernel: str, x: torch.Tensor, out: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None,
              per_token: bool) -> torch.Tensor:
        reference = int8_dot.int8_dot_linear_reference(x, w, bias, per_token)
        calls.append((kernel, x.shape[0], float((out.double() - reference).abs().max())))
        return out

    def rows(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None,
             per_token: bool = False) -> torch.Tensor:
        return check("rows", x, rows_kernel(x, w, bias, per_token), w, bias, per_token)

    def panels(x: torch.Tensor, packed: int8_dot.PackedPanels, bias: torch.Tensor | None = None) -> torch.Tensor:
        assert packed.per_token == (scheme == "w8a8")
        return check("panels", x, panel_kernel(x, packed, bias), weights[id(packed)], bias, packed.per_token)

    monkeypatch.setattr(int8_dot, "int8_dot_linear", rows)
    monkeypatch.setattr(int8_dot, "panel_linear", panels)
    ours, expected = _run_steps(quantized, steps), _run_steps(dense, steps)
    calls_per_step = quantized.config.num_layers * 4 + 1  # the layers' projections and the head
    assert [call[:2] for call in calls] == ([("panels", 20)] * calls_per_step + [("panels", 2)] * calls_per_step
                                            + [("rows", 1)] * calls_per_step)
    assert max(error for *_, error in calls) < 1e-4, calls
    error = (ours["a"] - expected["a"]).abs().max()
    assert error <= 0.06 * expected["a"].abs().max(), error


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_w8a8_steps_of_many_rows_run_one_int8_gemm_a_layer_and_stay_near_the_dense_model(arch, monkeypatch):
    # A prefill of int8_dot.INT_MM_MIN_ROWS tokens or more runs each projection as torch._int_mm on x rounded per
    # token; each call must equal the kernels' float64 reference on its input, and the logits stay near dense.
    # (Where AMX runs, jido's own int8 GEMM takes these steps instead: the next test.)
    monkeypatch.setattr(int8_dot, "takes_amx_gemm", lambda w: False)
    quantized, dense = _quantized_and_reference(arch, "w8a8", None)
    weights, calls = [m.qweight for m in _holding(quantized, "panels")], []
    int_mm = int8_dot.int_mm_linear

    def recorded(x: torch.Tensor, w: QuantizedWeight, bias: torch.Tensor | None = None,
                 channel_scale: torch.Tensor | None = None) -> torch.Tensor:
        assert channel_scale is None  # a model built without the runner is never smoothed
        out = int_mm(x, w, bias)
        reference = int8_dot.int8_dot_linear_reference(x, w, bias, per_token=True)
        calls.append((x.shape[0], any(w is v for v in weights), float((out.double() - reference).abs().max())))
        return out

    monkeypatch.setattr(int8_dot, "int_mm_linear", recorded)
    gen = torch.Generator().manual_seed(5)
    prompt = {"a": torch.randint(3, 128, (int8_dot.INT_MM_MIN_ROWS + 6,), generator=gen).tolist()}
    ours, expected = _run_steps(quantized, (prompt,)), _run_steps(dense, (prompt,))
    # the layers' projections, then the head (this runner takes logits at every position)
    assert [rows for rows, *_ in calls] == [int8_dot.INT_MM_MIN_ROWS + 6] * (quantized.config.num_layers * 4 + 1)
    assert all(known for _, known, _ in calls) and max(error for *_, error in calls) < 1e-4, calls
    assert (ours["a"] - expected["a"]).abs().max() <= 0.06 * expected["a"].abs().max()


@pytest.mark.skipif(not int8_dot.amx_runs(), reason="needs AMX-INT8 tiles (and the kernels built)")
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a8_on_amx_tiles_gives_the_logits_of_the_int_mm_route(arch, dtype, monkeypatch):
    # The AMX GEMM takes the projections whose K fills tile multiplies (all but the tiny models' down_proj, K 96),
    # in bf16 the gate/up projection with its activation fused: the same codes, sums and roundings as torch._int_mm
    # and act_and_mul, so the logits are the same bits.
    takes_amx_gemm = int8_dot.takes_amx_gemm

    def build(amx: bool) -> torch.nn.Module:
        monkeypatch.setattr(int8_dot, "takes_amx_gemm", takes_amx_gemm if amx else lambda w: False)
        return _w8a8_model(arch, dtype)

    on_tiles, on_int_mm = build(True), build(False)
    gemms = [m.layouts.amx_gemm for m in _holding(on_tiles, "amx_gemm")]
    assert any(g.gated for g in gemms) == (dtype == torch.bfloat16) and any(not g.gated for g in gemms)
    gen = torch.Generator().manual_seed(6)
    prompt = {"a": torch.randint(3, 128, (int8_dot.INT_MM_MIN_ROWS + 6,), generator=gen).tolist()}
    assert torch.equal(_run_steps(on_tiles, (prompt,))["a"], _run_steps(on_int_mm, (prompt,))["a"])


@pytest.mark.skipif(not int8_dot.int_mm_fuses_gated(), reason="needs AVX-512 BF16 (and the kernels built)")
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_w8a8_bf16_on_int_mm_applies_the_mlp_activation_as_it_scales_the_sums_with_the_same_logits(arch, monkeypatch):
    # Without AMX tiles a bf16 gate/up step of many rows runs torch._int_mm with act(gate) * up made as its sums are
    # scaled: the same bits as scaling into bf16 and then act_and_mul.
    monkeypatch.setattr(int8_dot, "takes_amx_gemm", lambda w: False)
    model = _w8a8_model(arch, torch.bfloat16)
    gen = torch.Generator().manual_seed(6)
    prompt = {"a": torch.randint(3, 128, (int8_dot.INT_MM_MIN_ROWS + 6,), generator=gen).tolist()}
    fused, calls = int8_dot.int_mm_gated, []
    monkeypatch.setattr(int8_dot, "int_mm_gated", lambda *a, **k: calls.append(1) or fused(*a, **k))
    logits = _run_steps(model, (prompt,))["a"]
    assert len(calls) == model.config.num_layers
    monkeypatch.setattr(int8_dot, "int_mm_fuses_gated", lambda: False)
    assert torch.equal(logits, _run_steps(model, (prompt,))["a"]) and len(calls) == model.config.num_layers


def _w8a8_model(arch: str, dtype: torch.dtype) -> torch.nn.Module:
    """The tiny ``arch`` model under w8a8, built as the engine builds it: its parameters made in ``dtype``."""
    hf, dense = tiny_models(arch)
    torch.set_default_dtype(dtype)
    try:
        model = type(dense)(dense.config, dense.model.layers[0].self_attn.backend,
                            quant_config=get_quantization_config("w8a8", None)).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    model.load_weights(hf.state_dict().items())
    process_weights_after_loading(model)
    return model


def _run_steps(model, steps: tuple[dict[str, list[int]], ...]) -> dict[str, torch.Tensor]:
    """The logits of the last of ``steps`` run one after another on a fresh paged cache."""
    runner = TinyPagedRunner(model)
    for tokens in steps:
        logits = runner.step(tokens)
    return logits


@pytest.mark.parametrize("scheme", ["int8", "int4", "w8a8"])
def test_quantized_layers_and_tied_embedding_keep_no_float_weight(scheme):
    quantized, _ = _quantized_and_reference("gemma3", scheme, None)
    layer = quantized.model.layers[0]
    for module in (layer.self_attn.qkv_proj, layer.mlp.down_proj):
        assert not hasattr(module, "weight") and module.qweight.bits == (4 if scheme == "int4" else 8)
    # The tied table stays at 8 bits under int4 too: in 4 bits it cost far more accuracy than the layers.
    table = quantized.model.embed_tokens
    assert not hasattr(table, "weight") and table.qweight.bits == 8 and quantized.lm_head is table


@pytest.mark.parametrize("scheme", ["int8", "int4", "w8a8"])
def test_an_untied_lm_head_is_held_by_the_logits_method_at_8_bits_with_no_copy_for_prefill(scheme, monkeypatch):
    # Llama's head is its own Linear, built with the layers' method, but the logits method holds it: int8 under int4
    # too (as the tied table), and no bf16 or prefill copy, which only a layer's steps of bf16 x multiply (the logits
    # multiply x.float() on the codes), nor a float source kept for w8a8's calibration (its forward never runs).
    monkeypatch.setattr(quantized_linear, "keeps_bf16_copy", lambda dtype, device: True)
    quantized, reference = _quantized_and_reference("llama", scheme, None)
    head = quantized.lm_head
    assert head is not quantized.model.embed_tokens and head.linear_method is quantized.logits_method
    assert not hasattr(head, "weight") and head.qweight.bits == 8
    assert all(getattr(head.layouts, name) is None
               for name in ("bf16_copy", "prefill_int_mm", "amx_gemm", "smoothing_source"))
    down_proj = quantized.model.layers[0].mlp.down_proj
    assert (down_proj.layouts.bf16_copy is not None) == (scheme != "w8a8")  # the layers keep theirs
    # The logits stay near the model holding the dequantized codes, the head's included (see the test above).
    ours, expected = TinyPagedRunner(quantized).step(TOKENS)["a"], TinyPagedRunner(reference).step(TOKENS)["a"]
    assert (ours - expected).abs().max() <= 0.06 * expected.abs().max()


def test_an_untied_lm_head_gets_no_amx_gemm_packing_under_w8a8_where_the_layers_get_theirs(monkeypatch):
    # On an AMX CPU w8a8 packs every layer for the AMX GEMM; the logits never run there, so the head must not hold
    # that second copy. The packing is stood in for here, so the check runs on every CPU kind, not only on AMX.
    packed = []

    def pack(qweight, gated=False):
        packed.append(qweight)
        return types.SimpleNamespace(gated=gated)

    monkeypatch.setattr(int8_dot, "takes_amx_gemm", lambda qweight: True)
    monkeypatch.setattr(int8_dot, "pack_amx_gemm", pack)
    quantized, _ = _quantized_and_reference("llama", "w8a8", None)
    head = quantized.lm_head
    assert head.layouts.amx_gemm is None and all(qweight is not head.qweight for qweight in packed)
    assert quantized.model.layers[0].mlp.down_proj.layouts.amx_gemm is not None


def _codes(rows: int, cols: int, group_size: int, offsets: bool, seed: int) -> QuantizedCodes:
    gen = torch.Generator().manual_seed(seed)
    groups = cols // group_size
    q = torch.randint(-32, 32, (rows, cols), generator=gen, dtype=torch.int8)
    return QuantizedCodes(q, torch.rand(rows, groups, generator=gen),
                          torch.randn(rows, groups, generator=gen) if offsets else None, group_size, f"g{group_size}")


def test_shards_of_different_group_sizes_and_offsets_merge_to_their_stacked_values():
    parts = [_codes(3, 64, 32, offsets=False, seed=0), _codes(2, 64, 16, offsets=True, seed=1),
             _codes(4, 64, 32, offsets=True, seed=2)]
    merged = merge_codes(parts)
    assert (merged.group_size, merged.source) == (16, "g32+g16")
    torch.testing.assert_close(merged.dequantize(), torch.cat([p.dequantize() for p in parts]), atol=0, rtol=0)


def test_codes_that_fit_four_bits_pack_into_four_bits():
    codes = _codes(2, 64, 32, offsets=True, seed=3)
    nibbles = QuantizedCodes(codes.q.abs().clamp(max=15), codes.scales, codes.offsets, 32, "Q4_K")
    assert (codes.pack().bits, nibbles.pack().bits) == (8, 4)
    torch.testing.assert_close(quant_kernels.dequantize(nibbles.pack()), nibbles.dequantize(), atol=0, rtol=0)


def test_scheme_names_agree_between_the_config_and_the_registry():
    assert set(typing.get_args(Quantization)) == set(QUANTIZATIONS)
    with pytest.raises(ValueError, match="gguf keeps the file's own groups"):
        get_quantization_config("gguf", 32)
    with pytest.raises(ValueError, match="even integer"):
        get_quantization_config("int4", 7)


def test_gguf_is_the_default_for_a_gguf_model_on_cpu_and_gguf_w8a8_is_opt_in():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_quantization(None, cpu, from_gguf=True) == "gguf"
    assert resolve_quantization("gguf_w8a8", cpu, from_gguf=True) == "gguf_w8a8"
    assert resolve_quantization(None, cuda, from_gguf=True) == "none"
    assert resolve_quantization(None, cpu, from_gguf=False) == "none"
    assert resolve_quantization("int8", cpu, from_gguf=True) == "int8"
    with pytest.raises(ValueError, match="needs a .gguf model"):
        resolve_quantization("gguf", cpu, from_gguf=False)
    with pytest.raises(ValueError, match="quantization 'gguf_w8a8' needs a .gguf model"):
        resolve_quantization("gguf_w8a8", cpu, from_gguf=False)
    with pytest.raises(ValueError, match="quantization 'w8a8' runs on CPU kernels; on cuda use quantization none"):
        resolve_quantization("w8a8", cuda, from_gguf=False)


# --- a tiny Llama GGUF whose projections use five different GGML types ---

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 2, 1, 32, 96
VOCAB = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁", "a", "b", "▁a", "ab"]
TYPES = {"attn_q": Q.Q5_0, "attn_k": Q.Q4_0, "attn_v": Q.Q8_0, "attn_output": Q.Q4_1, "ffn_gate": Q.Q5_1,
         "ffn_up": Q.Q4_0, "ffn_down": Q.Q8_0}


def mixed_llama_for_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ffn: int = FFN) -> Path:
    """The tiny mixed GGUF written into ``tmp_path``, with the engine's model cache (its converted folder) there too."""
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    path = tmp_path / "mixed.gguf"
    _write_mixed_llama(path, ffn)
    return path


def _write_mixed_llama(path: Path, ffn: int = FFN) -> None:
    rng = np.random.default_rng(0)
    writer = gguf_lib.GGUFWriter(str(path), "llama")
    for add, value in [(writer.add_block_count, 1), (writer.add_context_length, 128),
                       (writer.add_embedding_length, HIDDEN), (writer.add_feed_forward_length, ffn),
                       (writer.add_head_count, HEADS), (writer.add_head_count_kv, KV_HEADS),
                       (writer.add_rope_dimension_count, HEAD_DIM), (writer.add_layer_norm_rms_eps, 1e-5),
                       (writer.add_rope_freq_base, 10000.0), (writer.add_tokenizer_model, "llama"),
                       (writer.add_token_list, VOCAB), (writer.add_bos_token_id, 1), (writer.add_eos_token_id, 2),
                       (writer.add_unk_token_id, 0)]:
        add(value)
    writer.add_token_scores([0.0] * 259 + [-1.0, -2.0, -3.0, -4.0, -5.0])
    writer.add_token_types([2, 3, 3] + [6] * 256 + [1] * 5)
    shapes = {"attn_q": (HEADS * HEAD_DIM, HIDDEN), "attn_k": (KV_HEADS * HEAD_DIM, HIDDEN),
              "attn_v": (KV_HEADS * HEAD_DIM, HIDDEN), "attn_output": (HIDDEN, HEADS * HEAD_DIM),
              "ffn_gate": (ffn, HIDDEN), "ffn_up": (ffn, HIDDEN), "ffn_down": (HIDDEN, ffn)}
    for name, shape in shapes.items():
        w = rng.standard_normal(shape).astype(np.float32) * 0.3
        if name in ("attn_q", "attn_k"):
            w = llama_cpp_permute(w, HEADS if name == "attn_q" else KV_HEADS)
        writer.add_tensor(f"blk.0.{name}.weight", quantize(w, TYPES[name]), raw_dtype=TYPES[name])
    for name in ("attn_norm", "ffn_norm"):
        writer.add_tensor(f"blk.0.{name}.weight", 1 + 0.1 * rng.standard_normal(HIDDEN).astype(np.float32))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    embedding = rng.standard_normal((len(VOCAB), HIDDEN)).astype(np.float32)
    writer.add_tensor("token_embd.weight", quantize(embedding, Q.Q8_0), raw_dtype=Q.Q8_0)
    output = rng.standard_normal((len(VOCAB), HIDDEN)).astype(np.float32)
    writer.add_tensor("output.weight", quantize(output, Q.Q4_0), raw_dtype=Q.Q4_0)
    write_and_close(writer)


def test_gguf_weights_arrive_as_codes_of_their_stored_types(tmp_path):
    path = tmp_path / "mixed.gguf"
    _write_mixed_llama(path)
    weights = dict(iter_gguf_weights(path))
    sources = {name: w.source for name, w in weights.items() if isinstance(w, QuantizedCodes)}
    assert sources["model.layers.0.self_attn.q_proj.weight"] == "Q5_0"
    assert sources["model.layers.0.self_attn.v_proj.weight"] == "Q8_0"
    assert sources["model.embed_tokens.weight"] == "Q8_0" and sources["lm_head.weight"] == "Q4_0"
    assert len(sources) == 9 and weights["model.norm.weight"].dtype == torch.float32


def test_gguf_codes_as_stored_score_and_generate_like_the_dequantized_checkpoint(tmp_path, monkeypatch, caplog,
                                                                                exact_x):
    path = mixed_llama_for_engine(tmp_path, monkeypatch)
    params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, prompt_logprobs=0)
    prompt = [1, 261, 262, 263, 260, 259, 261, 262] * 3
    runs = {}
    for scheme in ("gguf", "none"):
        with caplog.at_level("INFO", logger="jido"):
            llm = LLM(model=str(path), quantization=scheme, dtype="float32", kv_cache_memory="4MiB")
        assert f"quantization {scheme})" in caplog.text
        runs[scheme] = llm.generate([{"prompt_token_ids": prompt}], params)[0]
    gguf_run, dense_run = runs["gguf"], runs["none"]
    assert gguf_run.outputs[0].token_ids == dense_run.outputs[0].token_ids
    for ours, reference in zip(gguf_run.prompt_logprobs[1:], dense_run.prompt_logprobs[1:]):
        (token, ours_lp), = ours.items()
        assert abs(ours_lp.logprob - reference[token].logprob) < 1e-4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gguf_layer_keeps_only_its_codes_and_multiplies_every_step_by_them(dtype, monkeypatch):
    monkeypatch.setattr(quantized_linear, "keeps_bf16_copy", lambda dtype, device: False)  # no AMX copy
    from jido.layers.linear import Linear
    from jido.layers.parameter import default_device_and_dtype

    codes = _codes(48, 64, 32, offsets=True, seed=4)
    with default_device_and_dtype(torch.device("cpu"), dtype):
        layer = Linear(64, 48, quant_config=get_quantization_config("gguf"))
    layer.weight.weight_loader(layer.weight, codes, None)
    layer.linear_method.process_weights_after_loading(layer)
    assert [name for name, _ in layer.named_parameters()] == [] and not hasattr(layer, "dense_weight")
    assert layer.qweight.bits == 8
    for rows in (1, int8_dot.PANEL_MIN_ROWS - 1, int8_dot.PANEL_MIN_ROWS, 40):
        x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows)).to(dtype)
        if int8_dot.runs(layer.qweight):  # x rounded per block of 32, at every number of rows
            expected = int8_dot.int8_dot_linear_reference(x, layer.qweight)
        else:
            expected = x.double() @ codes.dequantize().double().t()
        tolerance = 1e-4 if dtype == torch.float32 else 0.05 * expected.abs().max().item()
        torch.testing.assert_close(layer(x).double(), expected, atol=tolerance, rtol=0.02 if tolerance > 1e-4 else 1e-5)


def _gguf_layer(dtype: torch.dtype, scheme: str = "gguf"):
    from jido.layers.linear import Linear
    from jido.layers.parameter import default_device_and_dtype

    with default_device_and_dtype(torch.device("cpu"), dtype):
        layer = Linear(64, 48, quant_config=get_quantization_config(scheme))
    if scheme.startswith("gguf"):
        layer.weight.weight_loader(layer.weight, _codes(48, 64, 32, offsets=True, seed=5), None)
    else:
        layer.weight.weight_loader(layer.weight, torch.randn(48, 64, generator=torch.Generator().manual_seed(5)))
    layer.linear_method.process_weights_after_loading(layer)
    return layer


@pytest.mark.skipif(not quantized_linear.cpu_info().has_onednn_bf16, reason="oneDNN cannot multiply bf16 here")
def test_with_a_bf16_copy_steps_from_its_row_threshold_multiply_it_and_fewer_rows_the_codes(monkeypatch):
    monkeypatch.setattr(quantized_linear, "keeps_bf16_copy", lambda dtype, device: dtype == torch.bfloat16)
    layer = _gguf_layer(torch.bfloat16)
    assert layer.layouts.bf16_copy.is_mkldnn and not hasattr(layer, "weight")
    # 40 rows where the panels run on AMX tiles (faster than the copy below it); on vector units 16, or up to 32 while
    # x's rows fit 20 KiB (this layer's 64 columns do)
    amx = layer.layouts.panels is not None and layer.layouts.panels.amx
    threshold = layer.layouts.bf16_copy_min_rows
    assert threshold == (quantized_linear.BF16_COPY_MIN_ROWS_AMX if amx else 33)
    bf16_weight = quant_kernels.dequantize(layer.qweight).bfloat16().double()
    for rows in (1, threshold - 1, threshold, 48):
        x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(rows)).bfloat16()
        out = layer(x)
        assert out.dtype == torch.bfloat16 and out.shape == (rows, 48)
        if rows >= threshold:  # x as it is, times the weight rounded to bf16
            expected = x.double() @ bf16_weight.t()
        else:  # the int8 dot kernels: x rounded per block of 32
            expected = int8_dot.int8_dot_linear_reference(x, layer.qweight)
        torch.testing.assert_close(out.double(), expected, atol=0.02 * expected.abs().max().item(), rtol=0.01)
    # The copy is what a step of many rows reads: bf16 sums of the same x stay within bf16's rounding of it.
    many = torch.randn(threshold, 64, generator=torch.Generator().manual_seed(0)).bfloat16()
    torch.testing.assert_close(layer(many).double(), many.double() @ bf16_weight.t(), atol=0.05, rtol=2**-7)


def test_vector_panels_keep_steps_past_16_rows_while_x_fits_20_kib_and_amx_ones_up_to_40_rows():
    # Gemma 3 270M's layers: qkv and gate/up (640 columns) stay on the panels to 32 rows, o (1,024) to 20, down
    # (2,048) to 15; a narrow layer stops at 32 rows all the same.
    assert [quantized_linear.bf16_copy_min_rows(k, on_amx=False) for k in (640, 1024, 2048, 64)] == [33, 21, 16, 33]
    assert quantized_linear.bf16_copy_min_rows(640, on_amx=True) == quantized_linear.BF16_COPY_MIN_ROWS_AMX == 40


def test_a_bf16_copy_is_kept_only_where_asked_and_never_under_w8a8(monkeypatch):
    monkeypatch.setattr(quantized_linear, "keeps_bf16_copy", lambda dtype, device: False)
    assert _gguf_layer(torch.bfloat16).layouts.bf16_copy is None
    monkeypatch.setattr(quantized_linear, "keeps_bf16_copy", lambda dtype, device: True)
    assert _gguf_layer(torch.bfloat16, "w8a8").layouts.bf16_copy is None
    monkeypatch.undo()
    avx512 = {"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"}
    for flags, kept in ((avx512 | {"avx512_bf16"}, True), (avx512 | {"amx_bf16", "amx_tile"}, True),
                        ({"avx2", "fma"}, False), (avx512, False)):  # Zen 4, Sapphire Rapids, Zen 3, Skylake-X
        monkeypatch.setattr(quantized_linear, "cpu_info", lambda f=flags: CpuInfo("x", 2, frozenset(f)))
        assert quantized_linear.keeps_bf16_copy(torch.bfloat16, torch.device("cpu")) == (
            kept and torch.backends.mkldnn.is_available()), flags
        assert not quantized_linear.keeps_bf16_copy(torch.float32, torch.device("cpu"))


@pytest.mark.skipif(int8_dot.load_int8_dot_ops() is None, reason="no int8 dot kernel for this CPU")
def test_q5_codes_decode_one_row_from_five_bits_with_the_same_outputs(monkeypatch):
    gen = torch.Generator().manual_seed(6)
    layer = _q5_layer(gen, 48, 64)
    assert layer.layouts.five_bits.data.numel() == 48 * 2 * 20  # 20 bytes a block of 32 codes
    x = torch.randn(1, 64, generator=gen)
    expected = int8_dot.int8_dot_linear(x, layer.qweight)
    calls = []
    five_bit_linear = int8_dot.five_bit_linear
    monkeypatch.setattr(int8_dot, "five_bit_linear", lambda *a, **k: calls.append(1) or five_bit_linear(*a, **k))
    torch.testing.assert_close(layer(x), expected, atol=0, rtol=0)
    assert calls == [1]
    layer(torch.randn(2, 64, generator=gen))  # two rows run on the panels
    assert calls == [1]
    model = torch.nn.Sequential(layer)
    read = weight_bytes(model, prepacked=False)
    # the codes' bytes are not read
    assert read == layer.layouts.five_bits.data.numel() + layer.qweight.scales.numel() * layer.qweight.scales.element_size()
    assert weight_bytes(model) - read == layer.qweight.data.numel() + layer.layouts.panels.nbytes


def _q5_layer(gen: torch.Generator, rows: int = 40, cols: int = 96) -> torch.nn.Module:
    """A float32 ``rows`` x ``cols`` Linear on random Q5_0 codes drawn from ``gen`` under ``gguf``: it holds panels and
    five-bit rows where the kernels run."""
    from jido.layers.linear import Linear
    from jido.layers.parameter import default_device_and_dtype

    codes = QuantizedCodes(torch.randint(-16, 16, (rows, cols), generator=gen, dtype=torch.int8),
                           torch.rand(rows, cols // 32, generator=gen), None, 32, "Q5_0")
    with default_device_and_dtype(torch.device("cpu"), torch.float32):
        layer = Linear(cols, rows, quant_config=get_quantization_config("gguf"))
    layer.weight.weight_loader(layer.weight, codes, None)
    layer.linear_method.process_weights_after_loading(layer)
    return layer


@pytest.mark.skipif(int8_dot.load_int8_dot_ops() is None, reason="no int8 dot kernel for this CPU")
def test_the_route_settled_at_load_reads_the_weights_the_layer_holds_at_each_call():
    """Moving weights into huge pages replaces a layer's codes, panels and five-bit rows after load: the kernels'
    route bound at load must multiply by what the layer holds then, and give what choosing per call gives."""
    layer, other = _q5_layer(torch.Generator().manual_seed(1)), _q5_layer(torch.Generator().manual_seed(2))
    xs = [torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows)) for rows in (1, 3, 9)]
    layer.qweight, layer.layouts.panels, layer.layouts.five_bits = (other.qweight, other.layouts.panels,
                                                                    other.layouts.five_bits)
    for x in xs:
        torch.testing.assert_close(layer(x), other(x), atol=0, rtol=0)
    other.layouts.linear = None  # apply's own choice, per call
    for x in xs:
        torch.testing.assert_close(layer(x), other(x), atol=0, rtol=0)


@pytest.mark.skipif(int8_dot.load_int8_dot_ops() is None, reason="no int8 dot kernel for this CPU")
@pytest.mark.skipif(huge_pages.thp_mode() not in ("always", "madvise"), reason="transparent huge pages are off")
def test_moving_weights_into_huge_pages_moves_the_panels_and_five_bit_rows_the_bound_route_reads(monkeypatch):
    monkeypatch.setattr(huge_pages, "MIN_BYTES", 1)
    layer = _q5_layer(torch.Generator().manual_seed(3))
    xs = [torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows)) for rows in (1, 3)]  # five bits, panels
    before, held = [layer(x) for x in xs], (layer.layouts.panels, layer.layouts.five_bits)
    moved = huge_pages.move_weights_to_huge_pages(torch.nn.Sequential(layer))
    panels, five = layer.layouts.panels, layer.layouts.five_bits
    assert panels is not held[0] and five is not held[1] and moved >= panels.nbytes + five.data.numel()
    read = []
    five_bit_linear, panel_linear = int8_dot.five_bit_linear, int8_dot.panel_linear
    monkeypatch.setattr(int8_dot, "five_bit_linear", lambda x, w, *a: read.append(w) or five_bit_linear(x, w, *a))
    monkeypatch.setattr(int8_dot, "panel_linear", lambda x, w, *a: read.append(w) or panel_linear(x, w, *a))
    assert all(torch.equal(layer(x), out) for x, out in zip(xs, before))
    assert len(read) == 2 and read[0] is five and read[1] is panels


def test_gguf_codes_are_read_from_the_file_at_each_load_and_nothing_derived_is_written(tmp_path):
    from jido.models.loader import iter_quantized_weights, resolve_model

    path = tmp_path / "mixed.gguf"
    _write_mixed_llama(path)
    folder = resolve_model(str(path), cache_dir=tmp_path / "cache")
    expected = list(iter_gguf_weights(path))
    run = list(iter_quantized_weights(folder))
    # The converted folder holds what the file describes (config, tokenizer), no weights in any form.
    assert not list(folder.glob("*.safetensors"))
    assert [name for name, _ in run] == [name for name, _ in expected]
    for (name, ours), (_, reference) in zip(run, expected):
        if isinstance(reference, QuantizedCodes):
            assert (ours.source, ours.group_size) == (reference.source, reference.group_size), name
            assert torch.equal(ours.q, reference.q) and torch.equal(ours.scales, reference.scales), name
            assert (ours.offsets is None) == (reference.offsets is None), name
            assert ours.offsets is None or torch.equal(ours.offsets, reference.offsets), name
        else:
            assert torch.equal(ours, reference), name


def test_gguf_codes_need_the_source_gguf(tmp_path):
    from jido.models.loader import iter_quantized_weights

    with pytest.raises(ValueError, match="not converted from a GGUF file that still exists"):
        list(iter_quantized_weights(tmp_path))


def test_prepacked_panels_count_as_held_weights_but_not_as_what_a_decode_step_reads():
    quantized, _ = _quantized_and_reference("gemma3", "int8", None)
    panels = [m.layouts.panels for m in _holding(quantized, "panels")]
    assert len(panels) == quantized.config.num_layers * 4 + 1  # every projection and the tied head
    codes = sum(m.qweight.data.numel() for m in _holding(quantized, "panels"))
    assert sum(p.codes.numel() for p in panels) >= codes  # a byte a code, rows padded to panels of 8
    assert weight_bytes(quantized) - weight_bytes(quantized, prepacked=False) == sum(p.nbytes for p in panels)
