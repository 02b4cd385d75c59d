"""w8a8's SmoothQuant smoothing: the factors, a smoothed layer against float64, and the engine's calibration at load."""
from __future__ import annotations

import pytest
import torch
from test_quantized_linear import mixed_llama_for_engine

from jido.core.sampling_params import SamplingParams
from jido.engine.llm import LLM
from jido.layers import int8_dot
from jido.layers.linear import Linear
from jido.layers.parameter import default_device_and_dtype
from jido.layers.quantization import get_quantization_config
from jido.layers.quantized_layouts import layouts_of
from jido.layers.quantized_linear import smoothing_factors
from jido.runner import smoothing
from jido.utils.text_domains import DOMAINS, domain_text


def test_smoothing_factors_are_smoothquants_and_one_where_a_channel_has_no_range():
    x_max = torch.tensor([4.0, 0.0, 0.5, 9.0])
    weight = torch.tensor([[1.0, 2.0, -0.25, 0.0], [-3.0, 1.0, 0.5, 0.0]])
    s = smoothing_factors(x_max, weight, alpha=0.75)
    expected = [4.0**0.75 / 3.0**0.25, 1.0, 0.5**0.75 / 0.5**0.25, 1.0]
    torch.testing.assert_close(s.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6, atol=0)


def _w8a8_layer(weight: torch.Tensor) -> Linear:
    with default_device_and_dtype(torch.device("cpu"), torch.float32):
        layer = Linear(weight.shape[1], weight.shape[0], quant_config=get_quantization_config("w8a8"))
    layer.weight.weight_loader(layer.weight, weight)
    layer.linear_method.process_weights_after_loading(layer)
    return layer


@pytest.mark.parametrize("alpha", [0.5, smoothing.ALPHA])
def test_a_smoothed_layer_rounds_an_outlier_channels_input_far_better_than_per_token_alone(alpha):
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(48, 64, generator=gen)
    x = torch.randn(40, 64, generator=gen)
    x[:, 5] *= 60  # one channel with a range far beyond the others', as Gemma 3's activations have
    exact = x.double() @ weight.double().t()
    plain, smoothed = _w8a8_layer(weight), _w8a8_layer(weight)
    maxima = smoothed.linear_method.observe_inputs(smoothed)
    torch.testing.assert_close(smoothed(x), x @ weight.t())  # observing runs the float weight
    smoothed.linear_method.smooth(smoothed, maxima, alpha)
    assert smoothed.layouts.smoothing_source is None
    error_plain = (plain(x).double() - exact).abs().max()
    error_smoothed = (smoothed(x).double() - exact).abs().max()
    assert error_smoothed < error_plain / 3, (error_smoothed, error_plain)
    # A prefill (40 rows: panels or the int8 GEMM) and a decode row (the rows kernel) multiply x / s, rounded per
    # token, by the stored codes of W s: float64 of the same rounding.
    if int8_dot.runs(smoothed.qweight):
        inv = smoothed.layouts.smooth_inv
        for rows in (x, x[:1]):
            expected = int8_dot.int8_dot_linear_reference(rows * inv, smoothed.qweight, per_token=True)
            torch.testing.assert_close(smoothed(rows).double(), expected, atol=1e-4, rtol=1e-5)


def test_the_engine_smooths_every_w8a8_linear_at_load_and_serves_the_same_tokens_after_it(tmp_path, monkeypatch,
                                                                                           caplog):
    path = mixed_llama_for_engine(tmp_path, monkeypatch)
    with caplog.at_level("INFO", logger="jido"):
        llm = LLM(model=str(path), quantization="w8a8", dtype="float32", kv_cache_memory="4MiB")
    assert "w8a8: smoothed 4 of 4 linears (SmoothQuant, alpha 0.75)" in caplog.text

    def state(worker) -> dict[str, tuple[bool, bool]]:
        return {name: (m.layouts.smooth_inv is not None, m.layouts.smoothing_source is not None)
                for name, m in worker.runner.model.named_modules() if layouts_of(m) is not None}

    # The layer's q/k/v, o, gate/up and down; the untied LM head, which the calibration's forward does not run, is
    # quantized once, as the LM head, and never offered for calibration. No float source is left.
    layers = llm.collective_rpc(state)[0]
    assert {name for name, (smoothed, _) in layers.items() if smoothed} == {
        "model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj", "model.layers.0.mlp.gate_up_proj",
        "model.layers.0.mlp.down_proj"}
    assert "lm_head" in layers and not any(kept for _, kept in layers.values())
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    prompt = {"prompt_token_ids": [1, 261, 262, 263, 260, 259, 261, 262] * 3}
    first = llm.generate([prompt], params)[0].outputs[0].token_ids
    others = [{"prompt_token_ids": [1, 259 + i, 263, 260]} for i in range(3)]
    llm.generate(others + [prompt], params)
    assert llm.generate([prompt], params)[0].outputs[0].token_ids == first


def test_calibration_takes_one_chunk_from_each_calibration_domain_and_never_the_heldout_text():
    class Ids:  # a tokenizer of one id per character
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [ord(c) for c in text]

    chunks = smoothing.calibration_chunks(Ids(), vocab_size=128, max_tokens=100)
    assert len(chunks) == len(DOMAINS) and all(len(c) == 100 for c in chunks)
    for domain, chunk in zip(DOMAINS, chunks):
        text = domain_text("calibration", domain)
        assert chunk == [ord(c) for c in text if ord(c) < 128][:100], domain
        assert "".join(map(chr, chunk)) not in domain_text("heldout", domain), domain


def test_w8a8_with_a_kv_connector_calibrates_before_the_connector_is_bound_and_serves_the_same_tokens(
        tmp_path, monkeypatch, caplog):
    # The layers' attention runs through the connector's per-layer hooks, which have no connector during the
    # calibration forward (it is bound once the cache exists): they must stand aside, and a small cache still holds
    # the calibration's chunks (cut to its blocks).
    path = mixed_llama_for_engine(tmp_path, monkeypatch)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    prompt = {"prompt_token_ids": [1, 261, 262, 263, 260, 259, 261, 262] * 2}
    tokens = []
    for extra in ({}, {"kv_offload": {"cpu": "1MiB"}}):
        with caplog.at_level("INFO", logger="jido"):
            llm = LLM(model=str(path), quantization="w8a8", dtype="float32", kv_cache_memory="24KiB", block_size=4,
                      **extra)
        assert "w8a8: smoothed 4 of 4 linears" in caplog.text
        caplog.clear()
        tokens.append(llm.generate([prompt], params)[0].outputs[0].token_ids)
        llm.shutdown()
    assert tokens[0] == tokens[1]


# --- gguf_w8a8: the file's codes for decode, a smoothed w8a8 copy for prefill-sized steps ---

def _prefill_route(monkeypatch, route: str) -> int:
    """Make the int8 kernels take ``route`` (``amx``: the AMX int8 GEMM, skipped where it does not run; ``int_mm``:
    oneDNN's int8 GEMM, as on a CPU without AMX); the rows from which gguf_w8a8's prefill copy runs."""
    from jido.layers.quantized_linear import PREFILL_W8A8_MIN_ROWS

    if int8_dot.load_int8_dot_ops() is None:
        pytest.skip("the int8 kernels do not build here")
    if route == "amx":
        if not int8_dot.amx_runs():
            pytest.skip("the AMX int8 GEMM does not run here")
        return PREFILL_W8A8_MIN_ROWS
    monkeypatch.setattr(int8_dot, "amx_runs", lambda: False)
    return int8_dot.INT_MM_MIN_ROWS


@pytest.mark.parametrize("route", ["amx", "int_mm"])
def test_gguf_w8a8_keeps_the_codes_for_decode_and_rounds_prefill_rows_per_token_on_a_smoothed_int8_copy(
        monkeypatch, route):
    from test_quantized_linear import _gguf_layer

    from jido.layers import quant_kernels

    min_rows = _prefill_route(monkeypatch, route)
    hybrid, gguf = _gguf_layer(torch.bfloat16, "gguf_w8a8"), _gguf_layer(torch.bfloat16)
    if route == "amx":  # the int8 copy takes every step the bf16 copy would
        assert hybrid.layouts.bf16_copy is None and hybrid.layouts.amx_gemm.shape == (48, 64)
    else:  # the bf16 copy (where gguf keeps one) still takes the steps below int_mm's
        assert hybrid.layouts.prefill_int_mm.shape == (48, 64)
        assert (hybrid.layouts.bf16_copy is None) == (gguf.layouts.bf16_copy is None)
    source = hybrid.layouts.smoothing_source.float()  # the codes dequantized: what the int8 copy is made from
    torch.testing.assert_close(source, quant_kernels.dequantize(hybrid.qweight).bfloat16().float(), atol=0, rtol=0)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(min_rows + 8, 64, generator=gen)
    x[:, 5] *= 60  # an outlier channel
    x = x.bfloat16()
    exact = x.double() @ source.double().t()

    def check_decode_rows_match_gguf() -> None:  # gguf's routes, untouched, below the threshold
        for rows in (1, 2, 16, min_rows - 1):
            torch.testing.assert_close(hybrid(x[:rows]), gguf(x[:rows]), atol=0, rtol=0)

    check_decode_rows_match_gguf()
    plain = quant_kernels.quantize(source, 8, None)
    expected = int8_dot.int8_dot_linear_reference(x, plain, per_token=True)
    torch.testing.assert_close(hybrid(x).double(), expected, atol=0.02 * expected.abs().max().item(), rtol=0.01)

    def rms_error() -> float:  # over every output: their rounding to bf16 alone would dominate the largest error
        return (hybrid(x).double() - exact).pow(2).mean().sqrt().item()

    error_plain = rms_error()

    maxima = hybrid.linear_method.observe_inputs(hybrid)
    torch.testing.assert_close(hybrid(x), x @ source.bfloat16().t())  # observing runs the dequantized weight
    assert hybrid.linear_method.smooth(hybrid, maxima, smoothing.ALPHA)
    assert hybrid.layouts.smoothing_source is None and hybrid.layouts.smooth_inv is None
    check_decode_rows_match_gguf()
    s = smoothing_factors(maxima[0], source, smoothing.ALPHA)
    inv = (1 / s).bfloat16()
    expected = int8_dot.int8_dot_linear_reference(x * inv, quant_kernels.quantize(source * s, 8, None),
                                                  per_token=True)
    torch.testing.assert_close(hybrid(x).double(), expected, atol=0.02 * expected.abs().max().item(), rtol=0.01)
    assert rms_error() < error_plain / 2, (rms_error(), error_plain)


@pytest.mark.parametrize("route", ["amx", "int_mm"])
def test_gguf_w8a8_in_the_engine_serves_short_prompts_as_gguf_does_and_smooths_its_prefill_copies(
        tmp_path, monkeypatch, caplog, route):
    _prefill_route(monkeypatch, route)
    path = mixed_llama_for_engine(tmp_path, monkeypatch)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    short = {"prompt_token_ids": [1, 261, 262, 263, 260, 259, 261, 262] * 2}  # 16 rows: gguf's routes
    long = {"prompt_token_ids": [1, 261, 262, 263, 260, 259, 261, 262] * 9}  # 72 rows: prefill-sized on either
    # q/k/v, o and gate/up (K 64); on AMX tiles down's K of 96 is no tile multiple: it keeps gguf's bf16 route
    copies = ["model.layers.0.mlp.gate_up_proj", "model.layers.0.self_attn.o_proj",
              "model.layers.0.self_attn.qkv_proj"]
    if route == "int_mm":
        copies.insert(0, "model.layers.0.mlp.down_proj")
    copy_field = "amx_gemm" if route == "amx" else "prefill_int_mm"
    runs = {}
    for scheme in ("gguf", "gguf_w8a8"):
        caplog.clear()
        with caplog.at_level("INFO", logger="jido"):
            # Without prefix caching every prompt runs whole, through the routes its own length picks: with it, long
            # reused short's block and the rerun below its own, so their last rows ran on other routes than at first.
            llm = LLM(model=str(path), quantization=scheme, dtype="bfloat16", kv_cache_memory="4MiB",
                      enable_prefix_caching=False)
        runs[scheme] = [llm.generate([p], params)[0].outputs[0].token_ids for p in (short, long)]
        if scheme == "gguf_w8a8":
            count = len(copies)
            assert f"w8a8: smoothed {count} of {count} linears" in caplog.text, caplog.text  # not the untied LM head
            held = llm.collective_rpc(lambda w: sorted(
                n for n, m in w.runner.model.named_modules() if layouts_of(m) is not None
                and getattr(m.layouts, copy_field) is not None and m.layouts.smoothing_source is None))
            assert held[0] == copies
            others = [{"prompt_token_ids": [1, 259 + i, 263, 260] * 18} for i in range(3)]
            llm.generate(others + [long], params)
            assert llm.generate([long], params)[0].outputs[0].token_ids == runs[scheme][1]
        llm.shutdown()
    assert runs["gguf_w8a8"][0] == runs["gguf"][0]


def test_gguf_w8a8_in_a_float32_model_is_gguf():
    from test_quantized_linear import _gguf_layer

    layer = _gguf_layer(torch.float32, "gguf_w8a8")
    assert all(getattr(layer.layouts, a) is None for a in ("amx_gemm", "prefill_int_mm", "smoothing_source"))
    x = torch.randn(80, 64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(layer(x), _gguf_layer(torch.float32)(x), atol=0, rtol=0)
