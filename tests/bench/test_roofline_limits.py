"""jido roofline: bytes and FLOPs per token for known shapes, the machine cache and its key, the time cap, and
jido's share of the limit (never over 100%: a figure above its limit marks the limit suspect)."""
from __future__ import annotations

import dataclasses
import json
import types

import pytest

torch = pytest.importorskip("torch")

from jido.planner.model_shapes import CATALOG  # noqa: E402
from jido.tools import roofline  # noqa: E402
from jido.tools.roofline import MachinePeaks, RooflineConfig  # noqa: E402
from jido.utils.cpu import CpuInfo, cpu_info  # noqa: E402

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


def synthetic_peaks(matmul_flops: dict) -> MachinePeaks:
    return MachinePeaks("k", 40e9, matmul_flops, "now", cpu_info().as_dict(), "2.13.0", "v3.12.0")


def test_limits_divide_the_machine_peaks_by_the_model_cost():
    peaks = synthetic_peaks({"float32": 2e11, "bfloat16": 8e11})
    limit = roofline.limits(GEMMA, peaks, torch.bfloat16, prompt_len=512, decode_tokens=64)
    context = roofline.DECODE_PROMPT_LEN + 32
    assert limit["decode_tok_s"] == pytest.approx(40e9 / roofline.decode_bytes_per_token(GEMMA, 2, context))
    assert limit["prefill_tok_s"] == pytest.approx(8e11 / roofline.prefill_flops_per_token(GEMMA, 512))
    assert 70 < limit["decode_tok_s"] < 75  # ~0.54 GB of bf16 weights per token at 40 GB/s


def test_machine_figures_are_measured_once_then_read_from_the_cache(tmp_path, monkeypatch, capsys):
    config = RooflineConfig(cache_file=str(tmp_path / "roofline.json"), copy_mib=4, matmul_size=64)
    peaks, from_cache = roofline.cached_peaks(config, torch.device("cpu"))
    assert not from_cache and peaks.bandwidth_bytes_s > 0 and set(peaks.matmul_flops) == {"float32", "bfloat16"}
    assert peaks.cpu == cpu_info().as_dict() and peaks.torch == torch.__version__
    progress = capsys.readouterr().err
    assert "measuring copy bandwidth (4 MiB" in progress and "measuring bfloat16 matmul rate (64^3" in progress
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


def write_cache(path, matmul_flops: dict) -> None:
    peaks = synthetic_peaks(matmul_flops)
    path.write_text(json.dumps({**dataclasses.asdict(peaks), "key": roofline.machine_key(torch.device("cpu"))}))


@pytest.fixture
def gemma_folder(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "num_hidden_layers": 18, "hidden_size": 640, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "intermediate_size": 2048, "vocab_size": 262144, "tie_word_embeddings": True}))
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def fake_factory(monkeypatch, factory_kwargs: dict):
    """An engine timed on a fake clock: 20 decode tok/s, 1000 prefill tok/s."""
    clock = [0.0]
    monkeypatch.setattr(roofline, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))

    def factory(**kwargs):
        factory_kwargs.update(kwargs)
        # two ranks holding 100 MB and 50 MB of (quantized) weights
        return types.SimpleNamespace(llm_engine=FakeEngine(clock), collective_rpc=lambda fn: [100e6, 50e6])
    return factory


def test_roofline_main_prints_jidos_figures_as_a_share_of_the_limit(tmp_path, gemma_folder, monkeypatch, capsys):
    folder, cache = gemma_folder, tmp_path / "roofline.json"
    write_cache(cache, {"float32": 8e11, "bfloat16": 8e11})
    factory_kwargs = {}
    factory = fake_factory(monkeypatch, factory_kwargs)

    argv = ["--model", str(folder), "--dtype", "float32", "--cache-file", str(cache), "--json"]
    assert roofline.roofline_main(argv, factory) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["machine_from_cache"] is True and factory_kwargs["enable_prefix_caching"] is False
    assert result["jido"] == pytest.approx({"decode_tok_s": 20.0, "prefill_tok_s": 1000.0})
    limit = result["limit"]
    assert result["percent_of_limit"] == pytest.approx({k: 100 * v / limit[k] for k, v in result["jido"].items()})
    assert result["warnings"] == []
    # The decode limit is for the bytes the engine holds (a GGUF model's codes), not its parameters in float32.
    assert result["weights"] == "as jido's engine holds them" and limit["weight_bytes_per_token"] == 150e6
    float_limit = 40e9 / roofline.decode_bytes_per_token(GEMMA, 4, 0)  # 1.07 GB of float32 weights
    assert 6 * float_limit < limit["decode_tok_s"] < 40e9 / 150e6
    assert roofline.roofline_main([*argv[:-1], "--no-measure-jido"], factory) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("batch-1 decode tok/s") and out[-2].endswith(" -           -")
    assert "MB of weights read per decoded token (every parameter in float32)" in "\n".join(out)


def test_the_cache_key_of_an_avx2_day_differs_from_an_avx512_bf16_day(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(roofline, "cpu_info", lambda: CpuInfo("AMD EPYC", 2, frozenset({"avx2", "fma", "avx512f",
                                                                                      "avx512_bf16"})))
    avx512_day = roofline.machine_key(cpu)
    monkeypatch.setattr(roofline, "cpu_info", lambda: CpuInfo("AMD EPYC", 2, frozenset({"avx2", "fma"})))
    avx2_day = roofline.machine_key(cpu)
    assert avx512_day.startswith("cpu|AMD EPYC|avx512 avx2 fma avx512f avx512_bf16|")
    assert avx2_day.startswith("cpu|AMD EPYC|avx2 avx2 fma|") and avx2_day != avx512_day
    assert avx2_day.endswith(f"|torch {torch.__version__}|oneDNN {roofline.onednn_version()}")


def test_onednn_version_is_read_from_torchs_build_summary():
    assert roofline.onednn_version("  - Intel(R) MKL-DNN v3.12.0 (Git Hash 80afa71)") == "v3.12.0"
    assert roofline.onednn_version("  - Intel(R) oneDNN v3.5.3 (Git Hash 66f0cb9)") == "v3.5.3"
    assert roofline.onednn_version("  - OpenMP 201511 (a.k.a. OpenMP 4.5)") is None


def test_a_figure_above_its_limit_marks_the_limit_suspect_instead_of_a_share_over_100_percent():
    limit = {"decode_tok_s": 74.0, "prefill_tok_s": 1.3}
    shares, notes = roofline.check_limits(limit, {"decode_tok_s": 20.0, "prefill_tok_s": 141.9}, "bfloat16")
    assert shares == {"decode_tok_s": pytest.approx(100 * 20.0 / 74.0), "prefill_tok_s": None}
    assert notes == ["prefill limit suspect: jido measured 141.9 tok/s, above its limit of 1.3 tok/s, so the "
                     "bfloat16 matmul rate was measured too small (--remeasure to measure again)"]
    _, notes = roofline.check_limits(limit, {"decode_tok_s": 80.0}, "float32")
    assert notes == ["batch-1 decode limit suspect: jido measured 80.0 tok/s, above its limit of 74.0 tok/s, so "
                     "the copy bandwidth was measured too small (--remeasure to measure again)"]


def test_a_matmul_too_slow_to_measure_leaves_the_prefill_limit_unknown():
    limit = roofline.limits(GEMMA, synthetic_peaks({"float32": 2e11, "bfloat16": None}), torch.bfloat16, 512, 64)
    assert limit["prefill_tok_s"] is None and limit["decode_tok_s"] > 0
    shares, notes = roofline.check_limits(limit, {"decode_tok_s": 20.0, "prefill_tok_s": 900.0}, "bfloat16")
    assert shares["prefill_tok_s"] is None and shares["decode_tok_s"] > 0
    assert notes == ["prefill limit unknown: the bfloat16 matmul rate was too slow to measure within the time cap"]


def test_measurement_sizes_and_time_cap_are_bounded():
    with pytest.raises(ValueError, match=r"matmul_size must be an integer >= 2 and <= 8192, got 16384"):
        RooflineConfig(matmul_size=16384)
    with pytest.raises(ValueError, match=r"copy_mib must be an integer >= 2 and <= 4096, got 8192"):
        RooflineConfig(copy_mib=8192)
    with pytest.raises(ValueError, match=r"matmul_time_cap_s must be > 0 seconds, got 0"):
        RooflineConfig(matmul_time_cap_s=0)


def test_a_matmul_predicted_to_take_longer_than_the_time_cap_is_not_run():
    cpu = torch.device("cpu")
    assert roofline.matmul_rate(cpu, torch.float32, 512, time_cap_s=1e-9, repeats=1) is None
    assert roofline.matmul_rate(cpu, torch.float32, 64, time_cap_s=10.0, repeats=1) > 0


def test_roofline_main_prints_a_suspect_limit_and_no_share_over_100_percent(tmp_path, gemma_folder, monkeypatch,
                                                                            capsys):
    cache = tmp_path / "roofline.json"
    write_cache(cache, {"float32": 1e9, "bfloat16": None})  # a prefill limit of ~4.5 tok/s, below jido's 1000
    argv = ["--model", str(gemma_folder), "--dtype", "float32", "--cache-file", str(cache)]
    assert roofline.roofline_main(argv, fake_factory(monkeypatch, {})) == 0
    out = capsys.readouterr().out.splitlines()
    assert "  matmul bfloat16          too slow to measure" in out
    assert out[-2].startswith("prefill tok/s") and out[-2].split()[-2:] == ["1000.0", "suspect"]
    assert out[-1].startswith("! prefill limit suspect: jido measured 1000.0 tok/s, above its limit of 4.")
    # 20 tok/s of the 263.6 that 40 GB/s allows over the 150 MB the fake engine holds
    assert out[-3].startswith("batch-1 decode tok/s") and out[-3].split()[-3:] == ["263.6", "20.0", "8%"]
