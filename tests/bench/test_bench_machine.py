"""The machine record every result carries: CPU features, torch, and the bandwidth `jido roofline` measured."""
from __future__ import annotations

import json

import pytest

from jido.bench.machine import cpu_kind, describe_machine, machine_info, roofline_figures
from jido.bench.report import format_table
from jido.bench.summary import LATENCIES, PERCENTILES
from jido.utils.cpu import cpu_info


def test_bandwidth_and_onednn_come_from_a_roofline_cache_measured_on_this_cpu(tmp_path):
    cache = tmp_path / "roofline.json"
    cache.write_text(json.dumps({"cpu": cpu_info().as_dict(), "bandwidth_bytes_s": 41.23e9, "onednn": "v3.12.0"}))
    assert roofline_figures(cache) == {"memory_bandwidth_gb_s": 41.2, "onednn": "v3.12.0"}
    # The same machine kind on another day, with other vector flags than this CPU's.
    flags = ["avx2", "fma"] if "avx512f" in cpu_info().flags else ["avx2", "fma", "avx512f", "avx512_bf16"]
    other_day = {**cpu_info().as_dict(), "cpu_flags": flags, "native_bf16": not cpu_info().has_native_bf16}
    cache.write_text(json.dumps({"cpu": other_day, "bandwidth_bytes_s": 41.23e9, "onednn": "v3.12.0"}))
    assert roofline_figures(cache) == {"memory_bandwidth_gb_s": None, "onednn": None}
    assert roofline_figures(tmp_path / "missing.json") == {"memory_bandwidth_gb_s": None, "onednn": None}


def test_machine_info_records_the_cpu_features_and_torch(tmp_path):
    info = machine_info(tmp_path / "missing.json")
    assert {k: info[k] for k in cpu_info().as_dict()} == cpu_info().as_dict()
    assert info["torch"].startswith("2.") and info["memory_bandwidth_gb_s"] is None


def test_describe_machine_names_model_isa_flags_bf16_software_and_bandwidth():
    machine = {"cpu_model": "AMD EPYC", "num_cpus": 2, "isa": "avx2", "cpu_flags": ["avx2", "fma"],
               "native_bf16": False, "torch": "2.13.0", "onednn": "v3.12.0", "memory_bandwidth_gb_s": 38.5,
               "platform": "Linux"}
    assert describe_machine(machine) == ("AMD EPYC, 2 CPUs; avx2 (avx2 fma); no native bf16; torch 2.13.0, "
                                         "oneDNN v3.12.0; 38.5 GB/s copy bandwidth; Linux")


def test_the_bench_table_ends_with_the_machine_line():
    result = {k: 1 for k in ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
                             "request_throughput", "output_throughput", "total_token_throughput")}
    stats = ("mean", "median", *(f"p{p}" for p in PERCENTILES))
    result |= {f"{stat}_{name}_ms": 1.0 for name in LATENCIES for stat in stats}
    result["machine"] = {"cpu_model": "AMD EPYC", "num_cpus": 2, "isa": "avx2", "cpu_flags": ["avx2", "fma"],
                         "native_bf16": False, "platform": "Linux"}
    assert format_table(result).splitlines()[-2:] == [
        "Machine: AMD EPYC, 2 CPUs; avx2 (avx2 fma); no native bf16; Linux", "=" * 50]


@pytest.mark.parametrize(("model", "flags", "isa", "kind"), [
    ("AMD EPYC 9B14 96-Core Processor", ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16"], "avx512", "zen4"),
    ("AMD EPYC 7B13 64-Core Processor", ["avx2", "fma"], "avx2", "avx2-epyc"),
    ("Intel(R) Xeon(R) Platinum 8481C CPU", ["avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16",
                                             "amx_int8", "amx_tile"], "amx", "amx-xeon"),
    ("Intel(R) Xeon(R) Processor", ["avx2", "fma", "avx512f", "avx512bw", "avx512_vnni"], "avx512", "xeon-vnni"),
    ("Intel(R) Xeon(R) CPU @ 2.20GHz", ["avx2", "fma"], "avx2", "avx2"),
    ("AMD EPYC 9B14", ["avx2", "fma", "avx512f", "avx512_vnni"], "avx512", "avx512"),
    ("Apple M2", [], "scalar", "scalar"),
])
def test_cpu_kind_names_the_machines_the_results_index_defines(model, flags, isa, kind):
    assert cpu_kind({"cpu_model": model, "cpu_flags": flags, "isa": isa}) == kind


def test_cpu_kind_defaults_to_this_machine():
    assert cpu_kind() == cpu_kind(cpu_info().as_dict())
