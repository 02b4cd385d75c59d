"""CPU feature detection: parsing /proc/cpuinfo and the precision/ISA decisions made from the flags."""
from jido.utils.cpu import CpuInfo, parse_cpuinfo

_ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512bw avx512_vnni avx512_bf16 avx512vl
processor\t: 1
model name\t: other
flags\t\t: fpu
"""


def test_parse_cpuinfo_reads_the_first_processors_model_and_flags():
    model, flags = parse_cpuinfo(_ZEN4)
    assert model == "AMD EPYC 9R14"
    assert {"avx2", "avx512_bf16", "avx512vl"} <= flags and "fpu" in flags


def test_native_bf16_needs_avx512_bf16_or_amx():
    avx2_only = CpuInfo("x", 2, frozenset({"avx2", "fma"}))
    assert not avx2_only.has_native_bf16 and avx2_only.isa == "avx2"
    zen4 = CpuInfo("x", 2, parse_cpuinfo(_ZEN4)[1])
    assert zen4.has_native_bf16 and zen4.isa == "avx512"
    sapphire = CpuInfo("x", 2, frozenset({"avx2", "fma", "avx512f", "amx_bf16", "amx_tile"}))
    assert sapphire.has_native_bf16 and sapphire.isa == "amx"
    assert CpuInfo("x", 1, frozenset()).isa == "scalar"


def test_describe_lists_the_key_flags_in_a_fixed_order():
    info = CpuInfo("AMD EPYC", 2, frozenset({"avx512_bf16", "avx2", "fma", "sse2"}))
    assert info.describe() == "AMD EPYC, 2 CPUs, avx2 (avx2 fma avx512_bf16)"
    assert info.as_dict()["cpu_flags"] == ["avx2", "fma", "avx512_bf16"]


def test_auto_dtype_follows_native_bf16():
    import torch

    from jido.runner.model_loading import resolve_dtype
    cpu = torch.device("cpu")
    assert resolve_dtype("auto", cpu, CpuInfo("x", 2, frozenset({"avx2", "fma"}))) == torch.float32
    assert resolve_dtype("auto", cpu, CpuInfo("x", 2, frozenset({"avx512f", "avx512_bf16"}))) == torch.bfloat16
    assert resolve_dtype("auto", torch.device("cuda"), CpuInfo("x", 2, frozenset())) == torch.bfloat16
    assert resolve_dtype("float32", cpu, CpuInfo("x", 2, frozenset({"avx512_bf16"}))) == torch.float32
