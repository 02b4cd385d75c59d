"""The allocator keeps a step's large freed blocks: once steady, the same size made again touches no fresh pages."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from jido.utils import malloc_policy

# A child process makes a 40 MiB float32 tensor, fills it and frees it, sixteen times, and counts the page faults
# of the last four (the policy is process-wide and cannot be unset, so each case gets its own process). Under the
# policy the heap first grows a few times: torch asks for 64-byte aligned blocks, which do not fit the hole an equal
# block left until two holes have merged (measured: steady from the sixth to the eighth time on).
PROBE = textwrap.dedent("""
    import resource, sys, torch
    from jido.utils.malloc_policy import keep_freed_blocks
    if sys.argv[1] == "keep":
        assert keep_freed_blocks()
    def fill():
        torch.empty(10 << 20, dtype=torch.float32).fill_(1.0)
    for _ in range(12):
        fill()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        fill()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _last_fills_faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(malloc_policy._mallopt() is None, reason="the C library has no mallopt")
def test_a_large_block_freed_and_made_again_is_reused_only_under_the_policy() -> None:
    # 40 MiB is 10,240 pages of 4 KiB: glibc by default maps and unmaps the block each time, so every page faults.
    assert _last_fills_faults("default") > 4 * 10_000
    assert _last_fills_faults("keep") < 500


TRIM_PROBE = textwrap.dedent("""
    import sys, torch
    from jido.utils.malloc_policy import give_back_free_memory, keep_freed_blocks
    def rss_kib():
        return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1])
    assert keep_freed_blocks()  # blocks come from the heap, as after the first large one under glibc's defaults
    blocks, pins = [], []
    for _ in range(200):  # 1 MiB blocks, each followed by a small one that stays: holes that cannot merge to the top
        blocks.append(torch.ones(1 << 18))
        pins.append(torch.ones(16))
    del blocks
    before = rss_kib()
    if sys.argv[1] == "trim":
        assert give_back_free_memory()
    print(before - rss_kib())
""")


@pytest.mark.skipif(malloc_policy._malloc_trim() is None, reason="the C library has no malloc_trim")
def test_free_memory_inside_the_heap_goes_back_to_the_kernel_only_when_given_back() -> None:
    def released_kib(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", TRIM_PROBE, mode], capture_output=True, text=True, check=True,
                             env={**os.environ, "OMP_NUM_THREADS": "1"})
        return int(out.stdout.split()[-1])

    assert released_kib("keep") < 10 << 10
    assert released_kib("trim") > 150 << 10  # of the 200 MiB freed
