"""`jido build-kernels`: compile every C++ kernel library for this CPU ahead of serving, and say which did not build.

`make` runs it after installing, so a missing compiler or a compile error stops the set-up with the compiler's
output, instead of a server that quietly runs its PyTorch fallbacks several times slower.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from jido.utils import cpp_build
from jido.utils.cpu import cpu_info


def _loaders() -> list[tuple[str, Callable[[], object]]]:
    """Each library's loader, by the library's prefix (the loaders build on first call)."""
    from jido.attention import cpu_extension
    from jido.layers import activation, int8_dot, quant_kernels, rms_norm
    from jido.models import gguf_blocks

    return [("jido_cpu_attn", cpu_extension.load_paged_decode),
            ("jido_cpu_prefill", lambda: cpu_extension._prefill_ops(cpu_extension.PREFILL_SOURCE)),
            ("jido_act", activation.load_activation_ops),
            ("jido_quant", quant_kernels.load_quant_ops),
            ("jido_norm", rms_norm.load_norm_ops),
            ("jido_int8_dot", int8_dot.load_int8_dot_ops),
            ("jido_gguf_decode", gguf_blocks.load_decode_ops)]


def build_all() -> dict[str, cpp_build.BuildOutcome | None]:
    """Build and load every library; its outcome by prefix (None: this CPU runs none of its kernels)."""
    outcomes: dict[str, cpp_build.BuildOutcome | None] = {}
    for prefix, load in _loaders():
        load()
        outcomes[prefix] = cpp_build.BUILDS.get(prefix)
    return outcomes


def format_outcomes(outcomes: dict[str, cpp_build.BuildOutcome | None]) -> str:
    """A line per library: built, or failed with the reason, the fallback and the log."""
    lines = [f"kernels for {cpu_info().describe()} (build ISA {cpp_build.target_isa()}), in {cpp_build.CACHE_ROOT}"]
    for prefix, outcome in outcomes.items():
        if outcome is None:
            lines.append(f"  {prefix:<18} not used on this CPU")
        elif outcome.loaded:
            lines.append(f"  {prefix:<18} built: {outcome.purpose}")
        else:
            lines.append(f"  {prefix:<18} FAILED: {outcome.purpose} ({outcome.reason}); {outcome.fallback} runs "
                         f"instead; compiler output: {outcome.log}")
    return "\n".join(lines)


def build_kernels_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jido build-kernels", description=__doc__.split("\n", 1)[0])
    parser.parse_args(argv)
    outcomes = build_all()
    print(format_outcomes(outcomes))
    failed = [prefix for prefix, outcome in outcomes.items() if outcome is not None and not outcome.loaded]
    if failed:
        print(f"jido build-kernels: {len(failed)} of {len(outcomes)} libraries failed to build: {', '.join(failed)}",
              file=sys.stderr)
    return 1 if failed else 0
