"""jido roofline: bytes and FLOPs per token for known shapes, the machine cache, and jido's share of the limit."""
from __future__ import annotations

import json
import types

import pytest

torch = pytest.importorskip("torch")

from jido.planner.model_shapes import CATALOG  # noqa: E402
from jido.tools import roofline  # noqa: E402
from jido.tools.roofline import MachinePeaks, RooflineConfig  # noqa: E402

GEMMA = CATALOG["gemma-3-270m"]
# Per layer: q and o 2*640*4*256, k and v 2*640*1*256, MLP 3*640*2048; the tied LM head 262144*640.
GEMMA_LAYER_PARAMS = 1_310_720 + 327_680 + 3_932_160
GEMMA_DECODE_PARAMS = 18 * GEMMA_LAYER_PARAMS + 262_144 * 640


def test_decode_reads_every_layer_and_the_lm_head_once_per_token():
    assert GEMMA_DECODE_PARAMS == 268_042_240
    assert roofline.decode_bytes_per_token(GEMMA, 4, 0) == 4 * GEMMA_DECODE_PARAMS
    # KV of 100 tokens: 2 (K,V) * 1 head * 256 dims * 2 bytes in each of the 18 layers (window 512 > 100).
    assert roofline.decode_bytes_per_token(GEMMA, 2, 100) == 2 * GEMMA_DECODE_PARAMS + 100 * 18 * 2 * 256 * 2


def test_prefill_flops_are_two_per_weight_plus_attention_and_one_lm_head():
    per_token = 2 * 18 * GEMMA_LAYER_PARAMS + 4 * 18 * 4 * 256 * 256 + 2 * 262_144 * 640 / 512
    assert roofline.prefill_flops_per_token(GEMMA, 512) == pytest.approx(per_token)


def test_limits_divide_the_machine_peaks_by_the_model_cost():
    peaks = MachinePeaks("k", 40e9, {"float32": 2e11, "bfloat16": 8e11}, "now")
    limit = roofline.limits(GEMMA, peaks, torch.bfloat16, prompt_len=512, decode_tokens=64)
    context = roofline.DECODE_PROMPT_LEN + 32
    assert limit["decode_tok_s"] == pytest.approx(40e9 / roofline.decode_bytes_per_token(GEMMA, 2, context))
    assert limit["prefill_tok_s"] == pytest.approx(8e11 / roofline.prefill_flops_per_token(GEMMA, 512))
    assert 70 < limit["decode_tok_s"] < 75  # ~0.54 GB of bf16 weights per token at 40 GB/s


def test_machine_figures_are_measured_once_then_read_from_the_cache(tmp_path, monkeypatch):
    config = RooflineConfig(cache_file=str(tmp_path / "roofline.json"), copy_mib=4, matmul_size=64)
    peaks, from_cache = roofline.cached_peaks(config, torch.device("cpu"))
    assert not from_cache and peaks.bandwidth_bytes_s > 0 and set(peaks.matmul_flops) == {"float32", "bfloat16"}
    monkeypatch.setattr(roofline, "measure_peaks", lambda *a: pytest.fail("measured again"))
    assert roofline.cached_peaks(config, torch.device("cpu")) == (peaks, True)
    monkeypatch.setattr(roofline, "machine_key", lambda device: "another machine")
    with pytest.raises(pytest.fail.Exception, match="measured again"):
        roofline.cached_peaks(config, torch.device("cpu"))


class FakeEngine:
    """Steps that take known times on a fake clock: 1 ms per prompt token in the first step, 50 ms per decode."""

    def __init__(self, clock: list[float]) -> None:
        self.clock, self.pending = clock, []

    def add_request(self, request_id, prompt, params) -> None:
        self.pending = [len(prompt) * 0.001] + [0.05] * (params.max_tokens - 1)

    def step(self) -> list:
        self.clock[0] += self.pending.pop(0)
        return []

    def has_unfinished_requests(self) -> bool:
        return bool(self.pending)


def test_roofline_main_prints_jidos_figures_as_a_share_of_the_limit(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "num_hidden_layers": 18, "hidden_size": 640, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "intermediate_size": 2048, "vocab_size": 262144, "tie_word_embeddings": True}))
    (folder / "model.safetensors").write_bytes(b"")
    cache = tmp_path / "roofline.json"
    cache.write_text(json.dumps({"key": roofline.machine_key(torch.device("cpu")), "bandwidth_bytes_s": 40e9,
                                 "matmul_flops": {"float32": 2e11, "bfloat16": 8e11}, "measured_at": "then"}))
    clock = [0.0]
    monkeypatch.setattr(roofline, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    factory_kwargs = {}

    def factory(**kwargs):
        factory_kwargs.update(kwargs)
        return types.SimpleNamespace(llm_engine=FakeEngine(clock))

    argv = ["--model", str(folder), "--dtype", "float32", "--cache-file", str(cache), "--json"]
    assert roofline.roofline_main(argv, factory) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["machine_from_cache"] is True and factory_kwargs["enable_prefix_caching"] is False
    assert result["jido"] == pytest.approx({"decode_tok_s": 20.0, "prefill_tok_s": 1000.0})
    assert result["percent_of_limit"]["decode_tok_s"] == pytest.approx(100 * 20.0 / result["limit"]["decode_tok_s"])
    assert roofline.roofline_main([*argv[:-1], "--no-measure-jido"], factory) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("batch-1 decode tok/s") and out[-2].endswith(" -           -")
