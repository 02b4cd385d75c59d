"""Resolves a model argument to an HF checkpoint folder (a GGUF file's metadata written out once) and reads its weights.

A GGUF model's folder holds what the file describes (config, tokenizer, generation config) and the name of the file;
its weights are always read from the GGUF itself, mapped read-only: quantized codes for the GGUF schemes, float
values for the others, decoded a tensor at a time at every load. Nothing derived from the weights is written: the
folder stays a few MiB beside the file, and no cache can go stale or be left half-written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from jido.layers.quantized_linear import QuantizedCodes
from jido.models import gguf, gguf_blocks, named
from jido.models.named import DEFAULT_MODEL

logger = logging.getLogger(__name__)

SOURCE_MARKER = "jido_gguf_source.json"  # in a converted folder: the GGUF it came from, for quantized loading
# Bumped when converted folders change (2: they name their source GGUF; 3: no float32 model.safetensors; 4: no
# decoded codes either, which took twice the file's size for four-bit files).
CONVERSION_VERSION = 4
_FLOAT_TYPES = {"F32", "F16", "BF16", "F64"}
ACCEPTED = ("a .gguf file, an HF checkpoint folder with config.json and *.safetensors, or a model name "
            f"({', '.join(named.NAMED_MODELS)}; `jido models` lists them)")


def resolve_model(model: str | None = None, cache_dir: Path | None = None) -> Path:
    """The HF checkpoint folder for `model`: a named model (None is the default), a .gguf file, or an HF folder.

    A named model's GGUF is assembled from its chunk packages and verified once (`named.assemble`). A GGUF
    file is converted once into `<cache_dir>/<name>-<hash>/`; later calls reuse that folder. Raises
    FileNotFoundError for a path that does not exist, ValueError for one that is not a model, and
    named.ModelNotInstalledError for a named model whose packages are missing.
    """
    root = named.cache_root(cache_dir)
    if (model or DEFAULT_MODEL) in named.NAMED_MODELS:
        return _converted(named.assemble(named.NAMED_MODELS[model or DEFAULT_MODEL], root), root)
    path = Path(model).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model {model!r}: no such file or folder; expected {ACCEPTED}")
    if path.is_dir():
        _check_hf_folder(path)
        return path
    if not gguf.is_gguf(path):
        raise ValueError(f"model {model!r} is a file but not a GGUF file (it does not start with b'GGUF'); "
                         f"expected {ACCEPTED}")
    return _converted(path, root)


def load_config(folder: Path) -> dict[str, Any]:
    """The folder's config.json as a dict."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ValueError(f"{folder}: no config.json; expected {ACCEPTED}")
    return json.loads(path.read_text(encoding="utf-8"))


def iter_weights(folder: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF parameter name, float tensor): a converted folder's from its GGUF, decoded one tensor at a time
    (see :func:`gguf.iter_hf_tensors`); an HF folder's from its safetensors, one shard at a time."""
    source = gguf_source(folder)
    if source is not None:
        for name, values in gguf.iter_hf_tensors(gguf.open_gguf_index(source), load_config(folder)):
            yield name, torch.from_numpy(values)
        return
    if (Path(folder) / SOURCE_MARKER).is_file():
        raise ValueError(f"{folder} was converted from a GGUF file that no longer exists; give the .gguf again")
    for shard in _weight_files(Path(folder)):
        with safe_open(shard, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def gguf_source(folder: Path) -> Path | None:
    """The GGUF file a converted folder was made from (None for an HF checkpoint, or if it has gone)."""
    marker = Path(folder) / SOURCE_MARKER
    if not marker.is_file():
        return None
    source = Path(json.loads(marker.read_text(encoding="utf-8"))["gguf"])
    return source if source.is_file() else None


def iter_gguf_weights(gguf_path: Path, config: dict[str, Any] | None = None
                      ) -> Iterator[tuple[str, torch.Tensor | QuantizedCodes]]:
    """Yield (HF name, tensor) from a GGUF file, 2-D quantized tensors still quantized as :class:`QuantizedCodes`,
    decoded one at a time from the file mapped read-only. ``config``: the model's HF config (read from the file's
    whole metadata when None, which takes seconds for a large vocabulary).

    Types without an integer decoder are dequantized to float32, with one log line naming them.
    """
    if config is None:
        config = gguf.hf_config(gguf.open_gguf(gguf_path))
    model = gguf.open_gguf_index(gguf_path)
    dequantized: set[str] = set()
    for raw in gguf.iter_raw_tensors(model, config):
        if len(raw.shape) == 2 and gguf_blocks.supported(raw.tensor_type):
            codes = gguf_blocks.decode(raw.data, raw.tensor_type, raw.shape)
            offsets = None if codes.offsets is None else torch.from_numpy(codes.offsets)
            supers = [None if s is None else torch.from_numpy(s) for s in (codes.scale_supers, codes.offset_supers)]
            yield raw.name, QuantizedCodes(torch.from_numpy(codes.q), torch.from_numpy(codes.scales), offsets,
                                           codes.group_size, raw.tensor_type.name, *supers)
            continue
        if raw.tensor_type.name not in _FLOAT_TYPES:
            dequantized.add(raw.tensor_type.name)
        yield raw.name, torch.from_numpy(raw.dequantize())
    if dequantized:
        logger.info("%s: GGML types %s have no quantized kernel here; dequantized them to float",
                    gguf_path.name, ", ".join(sorted(dequantized)))


def iter_quantized_weights(folder: Path) -> Iterator[tuple[str, torch.Tensor | QuantizedCodes]]:
    """:func:`iter_gguf_weights` of a converted folder's GGUF.

    Raises:
        ValueError: the folder was not converted from a GGUF file that still exists.
    """
    source = gguf_source(folder)
    if source is None:
        raise ValueError(f"{folder} was not converted from a GGUF file that still exists; quantization 'gguf' "
                         "needs one")
    yield from iter_gguf_weights(source, load_config(folder))


def generation_eos_ids(folder: Path) -> list[int]:
    """The ids that end generation: generation_config.json's eos_token_id, else config.json's."""
    folder = Path(folder)
    gen_path = folder / "generation_config.json"
    eos = json.loads(gen_path.read_text(encoding="utf-8")).get("eos_token_id") if gen_path.is_file() else None
    if eos is None:
        eos = load_config(folder).get("eos_token_id")
    if eos is None:
        return []
    return list(dict.fromkeys([eos] if isinstance(eos, int) else eos))


def _check_hf_folder(folder: Path) -> None:
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} has no config.json, so it is not an HF checkpoint folder; expected {ACCEPTED}")
    if not any(folder.glob("*.safetensors")):
        raise ValueError(f"{folder} has config.json but no *.safetensors weights; expected {ACCEPTED}")


def _weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        return [folder / name for name in sorted(set(weight_map.values()))]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{folder}: no *.safetensors weights")
    return files


def _cache_key(gguf_path: Path) -> str:
    stat = gguf_path.stat()
    # Path, size and mtime identify the file without hashing its gigabytes.
    digest = hashlib.sha256(f"{gguf_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()
    return f"{gguf_path.stem}-{digest[:12]}-v{CONVERSION_VERSION}"


def _converted(gguf_path: Path, cache_root: Path) -> Path:
    folder = cache_root / _cache_key(gguf_path)
    if (folder / "config.json").is_file():
        return folder
    _remove_older_versions(folder)
    cache_root.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=cache_root))
    try:
        convert_gguf(gguf_path, tmp)
        _write_json(tmp / SOURCE_MARKER, {"gguf": str(gguf_path.resolve())})
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like ~/.cache/huggingface
        # NOTE: the rename is the commit point; a folder under its final name is always complete.
        os.rename(tmp, folder)
    except OSError:
        if not (folder / "config.json").is_file():
            raise
        logger.info("another process converted %s first; using its folder", gguf_path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted %s to %s in %.1f s", gguf_path, folder, time.perf_counter() - start)
    return folder


def _remove_older_versions(folder: Path) -> None:
    """Delete the same file's folders from earlier conversion versions (version 2 held a float32 copy of every
    weight, 4x a Q4 file's size on disk; version 3 its decoded codes, 2x)."""
    stem = folder.name.rsplit("-v", 1)[0]
    for stale in folder.parent.glob(f"{stem}-v*"):
        version = stale.name.rsplit("-v", 1)[1]
        if stale.is_dir() and version.isdigit() and int(version) < CONVERSION_VERSION:
            logger.info("removing %s, a conversion by an earlier jido", stale)
            shutil.rmtree(stale, ignore_errors=True)


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write what an HF checkpoint folder says of a model besides its weights (config, tokenizer files, generation
    config) for a GGUF file into out_dir; the weights stay in the GGUF."""
    _write_model_files(gguf.open_gguf(gguf_path), out_dir)


def _write_model_files(model: gguf.GGUFFile, out_dir: Path) -> dict[str, Any]:
    """:func:`convert_gguf` on an opened file; returns the config it wrote."""
    config = gguf.hf_config(model)
    gguf.build_tokenizer(model).save(str(out_dir / "tokenizer.json"))
    _write_json(out_dir / "tokenizer_config.json", gguf.tokenizer_config(model))
    _write_json(out_dir / "generation_config.json", {
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": gguf.generation_eos_ids(model),
        "pad_token_id": config["pad_token_id"],
    })
    _write_json(out_dir / "config.json", config)
    return config


def write_float_checkpoint(gguf_path: Path, out_dir: Path) -> None:
    """An HF checkpoint with float32 weights for a GGUF file, for engines that cannot read GGUF (the benchmarks' vLLM
    peer); jido itself never writes or reads one."""
    model = gguf.open_gguf(gguf_path)  # once: parsing its metadata (a 262k-token vocabulary) is the slow part
    config = _write_model_files(model, out_dir)
    tensors = {name: torch.from_numpy(w) for name, w in gguf.iter_hf_tensors(model, config)}
    save_file(tensors, out_dir / "model.safetensors", metadata={"format": "pt", "source": gguf_path.name})


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
