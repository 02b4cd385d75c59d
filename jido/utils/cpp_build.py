"""Builds a library of torch ops from its C++ sources once per version of them, torch version and CPU ISA, and loads it.

The build runs with ``torch.utils.cpp_extension.load`` (g++ and ninja) into ``~/.cache/jido/torch_extensions/<key>``,
from copies of the sources made there (so every checkout of the same code shares the build), and a machine compiles
each version once: ahead of time by ``jido build-kernels`` (``make`` runs it), else at first
use. A build that fails (no compiler, no ninja, a compile error) is logged at ERROR with the command that rebuilds it,
its compiler output is kept in ``<key>.log``, and the caller stays on its PyTorch path, several times slower; every
library's outcome is in :data:`BUILDS`.

torch guards a build folder with a ``lock`` file that a process killed inside ``load`` (a timeout, Ctrl-C)
leaves behind, and every later ``load`` of that folder then waits for it forever. jido's processes take an
``flock`` on ``<key>.flock`` around ``load`` (the kernel drops it when its holder dies), so a ``lock`` file
found while holding it is such a leftover, and is removed.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from jido.utils.cpu import cpu_info

logger = logging.getLogger(__name__)

CACHE_ROOT = Path.home() / ".cache" / "jido" / "torch_extensions"
# Headers every library may include (bf16 conversions, the AMX tile state request), on each build's include path.
SHARED_HEADERS = Path(__file__).resolve().parent.parent / "csrc"
# Debugging switch: compile for this ISA instead of the CPU's widest, e.g. `avx2` on an AVX-512 machine to run
# the AVX2 build's tests where AVX2-only machines are not at hand.
BUILD_ISA_ENV = "JIDO_BUILD_ISA"

# Vector flags per ISA. Zen 4 runs 512-bit vectors at full rate, but GCC prefers 256-bit unless told.
ISA_FLAGS = {
    "amx": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c", "-mprefer-vector-width=512"],
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx2", "-mfma", "-mf16c", "-mprefer-vector-width=512"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
    "scalar": [],
}
# -fopenmp, not only -fopenmp-simd: ATen's at::parallel_for is inline code that forks threads only where the
# extension itself is compiled with OpenMP (`#ifdef _OPENMP`); without it every kernel ran on one thread (a read
# of the LM head read at one thread's bandwidth, about half the memory's, on 2 threads). The library links torch's own
# libgomp: the loader finds that soname already loaded by torch, so both share one thread pool.
COMMON_FLAGS = ["-O3", "-fopenmp"]
LINK_FLAGS = ["-fopenmp"]


@dataclass(frozen=True)
class BuildOutcome:
    """One library's build in this process: loaded, or why not and what runs instead."""

    purpose: str
    fallback: str
    loaded: bool
    reason: str = ""
    log: Path | None = None


# Every library this process built or tried to, by prefix: `jido build-kernels` reports them.
BUILDS: dict[str, BuildOutcome] = {}
REBUILD_COMMAND = "jido build-kernels"


def fallbacks() -> dict[str, str]:
    """The libraries this process failed to build, each with what runs instead and why (from :data:`BUILDS`)."""
    return {prefix: f"{outcome.fallback} ({outcome.reason})" for prefix, outcome in BUILDS.items()
            if not outcome.loaded}


def build_key(prefix: str, sources: Path | Sequence[Path], isa: str) -> str:
    """The cache folder name: the hash of the library's sources (one, or its units in order), the headers they may
    include (beside them and the shared ones) and its flags, the torch version and the ISA the code is compiled for."""
    sources = _as_list(sources)
    flags = " ".join([*COMMON_FLAGS, *ISA_FLAGS[isa], *LINK_FLAGS]).encode()
    folders = sorted({source.parent for source in sources})
    header_files = [*(h for folder in folders for h in sorted(folder.glob("*.h"))), *sorted(SHARED_HEADERS.glob("*.h"))]
    headers = b"".join(h.name.encode() + b"\0" + h.read_bytes() for h in header_files)
    # One source hashes as it always has (its libraries keep their builds); units by name and text.
    code = sources[0].read_bytes() if len(sources) == 1 else b"\0".join(
        s.name.encode() + b"\0" + s.read_bytes() for s in sources)
    digest = hashlib.sha256(code + b"\0" + headers + b"\0" + flags + b"\0" + _LAYOUT).hexdigest()[:16]
    return f"{prefix}_{digest}_torch{torch.__version__.replace('+', '_').replace('.', '_')}_{isa}"


# How a build folder is laid out, in the key so that builds of another layout keep their own folders: "staged", the
# sources and headers copied in (see _staged).
_LAYOUT = b"staged"


def _staged(build_dir: Path, sources: list[Path]) -> list[Path]:
    """The sources, and the headers beside them, copied into ``build_dir/src`` (the shared headers into
    ``build_dir/include``), each written only where it differs; the copies of the sources, to build.

    ninja rebuilds when its build file names other paths, so two checkouts of the same code (a clean clone beside a
    working tree, a benchmark's baseline beside the change) rebuilt the one folder their key shares in turn, seconds
    each time; building from the copies names the same paths from any checkout.

    Raises:
        ValueError: two of the files have one name.
    """
    files: dict[str, Path] = {}
    beside = (h for folder in sorted({s.parent for s in sources}) for h in sorted(folder.glob("*.h")))
    for path in [*sources, *beside]:
        if files.setdefault(path.name, path) != path:
            raise ValueError(f"{path} and {files[path.name]}: one name twice among a library's files")
    for name, path in files.items():
        _write_if_changed(build_dir / "src" / name, path.read_bytes())
    for header in sorted(SHARED_HEADERS.glob("*.h")):
        _write_if_changed(build_dir / "include" / header.name, header.read_bytes())
    return [build_dir / "src" / source.name for source in sources]


def _write_if_changed(path: Path, data: bytes) -> None:
    # Unchanged files keep their times, so ninja sees nothing new.
    if not path.is_file() or path.read_bytes() != data:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _as_list(sources: Path | Sequence[Path]) -> list[Path]:
    return [sources] if isinstance(sources, Path) else list(sources)


def target_isa(isa: str | None = None) -> str:
    """The ISA a build compiles for: ``isa``, else ``$JIDO_BUILD_ISA``, else this CPU's widest.

    Raises:
        ValueError: an ISA without flags here.
    """
    isa = isa or os.environ.get(BUILD_ISA_ENV) or cpu_info().isa
    if isa not in ISA_FLAGS:
        raise ValueError(f"unknown ISA {isa!r} (from {BUILD_ISA_ENV} or the caller); choose one of {list(ISA_FLAGS)}")
    return isa


def load_ops_library(prefix: str, sources: Path | Sequence[Path], purpose: str, fallback: str,
                     isa: str | None = None) -> bool:
    """Compile ``sources`` (one file, or a library's units: each compiled on its own, then linked) for ``isa``
    (default: ``$JIDO_BUILD_ISA``, else this CPU's) and load them, so their ``TORCH_LIBRARY`` ops appear under
    ``torch.ops``; False if it cannot, with the warning "``purpose`` unavailable (why); using ``fallback``".

    NOTE: a process can hold one build of a library only (its ops namespace is registered once), so a build for
    another ISA than this CPU's must be loaded in a fresh process.
    """
    isa = target_isa(isa)
    sources = _as_list(sources)
    key = build_key(prefix, sources, isa)
    build_dir = CACHE_ROOT / key
    try:
        build_dir.mkdir(parents=True, exist_ok=True)
        from torch.utils.cpp_extension import load

        with _build_lock(build_dir):
            staged = _staged(build_dir, sources)
            # A copy of LINK_FLAGS: load() appends torch's -L/-l flags to the list it is given.
            load(name=key, sources=[str(s) for s in staged], build_directory=str(build_dir), is_python_module=False,
                 extra_cflags=[*COMMON_FLAGS, *ISA_FLAGS[isa]], extra_ldflags=list(LINK_FLAGS),
                 extra_include_paths=[str(build_dir / "include")], verbose=False)
        BUILDS[prefix] = BuildOutcome(purpose, fallback, loaded=True)
        return True
    except Exception as exc:  # noqa: BLE001 - any failure to build or load means: use the PyTorch path
        message = str(exc).strip()
        reason = f"{type(exc).__name__}: {message.splitlines()[-1] if message else ''}"
        log = CACHE_ROOT / f"{key}.log"
        with contextlib.suppress(OSError):
            log.parent.mkdir(parents=True, exist_ok=True)
            names = ", ".join(map(str, sources))
            log.write_text(f"{purpose} ({names}, {isa}) failed to build or load:\n{message}\n", encoding="utf-8")
        BUILDS[prefix] = BuildOutcome(purpose, fallback, loaded=False, reason=reason, log=log)
        logger.error("%s unavailable (%s); using %s instead, several times slower. The compiler's output is in %s; "
                     "`%s` rebuilds every kernel and reports each", purpose, reason, fallback, log, REBUILD_COMMAND)
        return False


@contextlib.contextmanager
def _build_lock(build_dir: Path) -> Iterator[None]:
    """Hold ``<build_dir>.flock`` and clear a ``lock`` file that a process killed mid-build left in ``build_dir``."""
    with open(build_dir.with_name(build_dir.name + ".flock"), "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        stale = build_dir / "lock"
        if stale.exists():
            # No live jido process is inside torch's build without our flock: its holder died.
            logger.warning("removing %s, left by a process that died while building or loading there", stale)
            stale.unlink(missing_ok=True)
        yield
