"""jido bench talks HTTP only: importing all of it must not load torch or the engine."""
from __future__ import annotations

import subprocess
import sys

MODULES = ["cli", "client", "config", "corpus", "datasets", "machine", "progress", "report", "runner",
           "server_metrics", "summary", "tokens", "plots"]


def test_bench_never_imports_torch_or_the_engine():
    code = ("import sys\n" + "".join(f"import jido.bench.{m}\n" for m in MODULES) +
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'jido.engine',"
            " 'jido.runner', 'jido.models', 'jido.executor')))\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
