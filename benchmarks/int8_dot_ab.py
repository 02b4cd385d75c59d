"""The int8 panel kernel of the working tree against a git revision's, in one process: an A/B that holds on a host
whose speed drifts.

Builds ``jido/layers/csrc/int8_dot*.cpp`` as they are at ``--rev`` under another ops namespace (``jido_int8_dot_ab``)
beside the working tree's build, packs one random weight for each, checks that both give the same bits, and times
them alternately (the order flips every round) at each step size. Between processes on the 2-core hosts the same
build moved by up to half; within one, the ratio of identical sources stayed within 1.00-1.05.
Kinds of codes: ``q8`` (Q8_0-like: signed, groups of 32; the LM head), ``q4k`` (0..15 with mins, groups of 32),
``q6k`` (-32..31, groups of 16; the down projection).

    .venv/bin/python benchmarks/int8_dot_ab.py --rev HEAD~1 --rows 2 8 16 32              # the LM head's shape
    .venv/bin/python benchmarks/int8_dot_ab.py --kind q6k --n 640 --k 2048 --rows 2 4 8   # the down projection
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from jido.layers import int8_dot
from jido.utils.cpp_build import load_ops_library
from jido.utils.malloc_policy import keep_freed_blocks

REPO = Path(__file__).resolve().parent.parent
CSRC = Path("jido/layers/csrc")
KINDS = {"q8": (-127, 128, 32, False), "q4k": (0, 16, 32, True), "q6k": (-32, 32, 16, False)}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, check=True, capture_output=True, text=True).stdout


def build_revision(rev: str) -> object:
    """torch.ops.jido_int8_dot_ab: the kernels as ``rev`` has them (``int8_dot.cpp`` and the per-ISA units beside it
    where ``rev`` has them, with the headers beside them at ``rev``), their namespace renamed. The build is cached by
    content, as the tree's is, so the sources go once it is loaded."""
    with tempfile.TemporaryDirectory(prefix="int8_dot_ab-") as folder:
        sources = []
        for name in _git("ls-tree", "--name-only", rev, f"{CSRC}/").split():
            path = Path(folder) / Path(name).name
            if not path.name.endswith(".h") and not (path.name.startswith("int8_dot") and path.suffix == ".cpp"):
                continue
            text = _git("show", f"{rev}:{name}")
            if path.name.startswith("int8_dot"):
                text = text.replace("jido_int8_dot", "jido_int8_dot_ab")
            path.write_text(text, encoding="utf-8")
            if path.suffix == ".cpp":
                sources.append(path)
        sources.sort(key=lambda path: path.name != "int8_dot.cpp")  # the ops first, as int8_dot.SOURCES
        if not load_ops_library("jido_int8_dot_ab", sources, f"int8_dot at {rev}", "nothing"):
            raise SystemExit(f"could not build int8_dot.cpp at {rev}")
    return torch.ops.jido_int8_dot_ab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rev", default="HEAD", help="the revision to compare the working tree with")
    parser.add_argument("--kind", default="q8", choices=list(KINDS))
    parser.add_argument("--n", type=int, default=262144, help="output features (the LM head's by default)")
    parser.add_argument("--k", type=int, default=640, help="input features")
    parser.add_argument("--rows", nargs="+", type=int, default=[2, 8, 16, 32])
    parser.add_argument("--rounds", type=int, default=24)
    args = parser.parse_args()
    keep_freed_blocks()  # as a CPU worker runs: no fresh pages for every output
    if int8_dot.load_int8_dot_ops() is None:
        raise SystemExit("the int8 dot kernels do not run here")
    ops = {"tree": torch.ops.jido_int8_dot, args.rev: build_revision(args.rev)}
    lo, hi, group, with_mins = KINDS[args.kind]
    gen = torch.Generator().manual_seed(0)
    data = torch.randint(lo, hi, (args.n, args.k), dtype=torch.int8, generator=gen)
    scales = torch.rand(args.n, args.k // group, generator=gen) * 0.01
    mins = torch.rand(args.n, args.k // group, generator=gen) * 0.01 if with_mins else None
    isa = int8_dot._isa_index()
    packs = {name: op.pack_panels(data, scales, mins, group, 8, args.k, isa, 0) for name, op in ops.items()}

    def run(name: str, x: torch.Tensor) -> torch.Tensor:
        return ops[name].panel_linear(x, *packs[name], args.n, args.k, group, None, isa, 0)

    print(f"{args.kind} [{args.n}, {args.k}], {torch.get_num_threads()} threads: the tree's time over {args.rev}'s")
    for rows in args.rows:
        x = torch.randn(rows, args.k, generator=gen).bfloat16()
        if not torch.equal(run("tree", x), run(args.rev, x)):
            raise SystemExit(f"{rows} rows: the outputs differ from {args.rev}'s")
        times: dict[str, list[float]] = {name: [] for name in ops}
        for r in range(args.rounds):
            for name in (list(ops) if r % 2 else list(ops)[::-1]):
                start = time.perf_counter()
                run(name, x)
                times[name].append(time.perf_counter() - start)
        ratio = statistics.median(t / b for t, b in zip(times["tree"], times[args.rev]))
        print(f"{rows:>4} rows: tree {1e3 * statistics.median(times['tree']):.2f} ms, {args.rev} "
              f"{1e3 * statistics.median(times[args.rev]):.2f} ms, median paired ratio {ratio:.3f}", flush=True)


if __name__ == "__main__":
    main()
