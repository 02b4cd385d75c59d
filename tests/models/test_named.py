"""Named models: assembling chunk packages into a verified GGUF, redoing a bad one, and `jido models`."""

from __future__ import annotations

import hashlib
import importlib
import json
from pathlib import Path

import pytest

from jido.cli import main
from jido.models import gguf, named
from jido.models.loader import resolve_model
from jido.models.named import NAMED_MODELS, CorruptModelError, ModelNotInstalledError, NamedModel

CHUNKS = [b"GGUF" + bytes(range(200)), bytes(range(255, 0, -1)) * 3, b"tail"]


@pytest.fixture
def chunk_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Three importable chunk packages (``fake_chunk_partN`` with ``data/partNN.bin``) on sys.path."""
    site = tmp_path / "site"
    paths = []
    for i, data in enumerate(CHUNKS, 1):
        package = site / f"fake_chunk_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        paths.append(package / "data" / f"part{i:02d}.bin")
        paths[-1].write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    return paths


def _model(sha256: str | None = None, size: int | None = None, num_chunks: int = 3) -> NamedModel:
    whole = b"".join(CHUNKS)
    return NamedModel("fake", "a fake model", "fake-extra", tuple(f"fake_chunk_part{i}" for i in range(1, num_chunks + 1)),
                      "fake.gguf", len(whole) if size is None else size,
                      sha256 or hashlib.sha256(whole).hexdigest())


def test_chunks_are_concatenated_in_order_into_a_verified_file(chunk_packages, tmp_path):
    path = named.assemble(_model(), tmp_path / "cache")
    assert path == tmp_path / "cache" / "gguf" / "fake.gguf"
    assert path.read_bytes() == b"".join(CHUNKS)
    assert named.is_verified(_model(), tmp_path / "cache")
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake.gguf", "fake.gguf.verified"]


def test_a_verified_file_is_reused_without_rewriting_it(chunk_packages, tmp_path):
    path = named.assemble(_model(), tmp_path)
    mtime = path.stat().st_mtime_ns
    chunk_packages[0].write_bytes(b"changed after assembly")  # not read again: the stamp vouches for the file
    assert named.assemble(_model(), tmp_path) == path
    assert path.stat().st_mtime_ns == mtime


@pytest.mark.parametrize("damage", ["truncated", "same_size_rewritten", "no_stamp"])
def test_an_interrupted_or_corrupt_file_is_detected_and_reassembled(chunk_packages, tmp_path, damage):
    path = named.assemble(_model(), tmp_path)
    if damage == "truncated":  # an assembly killed midway, or a disk that filled up
        path.write_bytes(path.read_bytes()[:100])
    elif damage == "same_size_rewritten":
        path.write_bytes(bytes(path.stat().st_size))
    else:
        (path.parent / "fake.gguf.verified").unlink()
    assert not named.is_verified(_model(), tmp_path)
    assert named.assemble(_model(), tmp_path).read_bytes() == b"".join(CHUNKS)
    assert named.is_verified(_model(), tmp_path)


def test_chunks_that_do_not_match_the_record_raise_and_leave_no_file(chunk_packages, tmp_path):
    with pytest.raises(CorruptModelError, match=r"concatenate to 973 bytes .* not the recorded 973 bytes and 0+; "
                                                r"reinstall them \(pip install 'jido\[fake-extra\]' --force-reinstall\)"):
        named.assemble(_model(sha256="0" * 64), tmp_path)
    assert list((tmp_path / "gguf").iterdir()) == []


def test_a_missing_chunk_package_names_the_extra_to_install(chunk_packages, tmp_path):
    model = _model(num_chunks=4)
    assert not named.is_installed(model)
    with pytest.raises(ModelNotInstalledError, match=r"'fake' is not installed \(missing fake_chunk_part4\); "
                                                     r"install it with: pip install 'jido\[fake-extra\]'"):
        named.assemble(model, tmp_path)


def test_the_cache_root_is_the_argument_then_the_environment_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv(named.CACHE_DIR_ENV, str(tmp_path / "env"))
    assert named.cache_root(tmp_path / "arg") == tmp_path / "arg"
    assert named.cache_root() == tmp_path / "env"
    monkeypatch.delenv(named.CACHE_DIR_ENV)
    assert named.cache_root() == Path.home() / ".cache" / "jido"


def test_jido_models_lists_every_named_model_with_its_state_and_size(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(named.CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(named, "is_installed", lambda model: model.name != "qwen2.5-coder-1.5b-instruct")
    assert main(["models"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:4]}
    assert list(rows) == list(NAMED_MODELS)
    assert "241 MiB  installed  pip install jido " in rows["gemma-3-270m"] and "(default)" in rows["gemma-3-270m"]
    assert "469 MiB  installed  pip install 'jido[qwen]'" in rows["qwen2.5-coder-0.5b-instruct"]
    assert "1066 MiB  missing    pip install 'jido[qwen-1-5b]'" in rows["qwen2.5-coder-1.5b-instruct"]


@pytest.mark.slow
@pytest.mark.parametrize("name, num_tensors, num_layers", [("gemma-3-270m", 236, 18),
                                                          ("qwen2.5-coder-0.5b-instruct", 291, 24),
                                                          ("qwen2.5-coder-1.5b-instruct", 339, 28)])
def test_each_installed_named_model_assembles_to_its_recorded_gguf(name, num_tensors, num_layers):
    model = NAMED_MODELS[name]
    if not named.is_installed(model):
        pytest.skip(f"{name} is not installed ({model.install_hint})")
    path = named.assemble(model, named.cache_root())
    assert path.stat().st_size == model.size and gguf.is_gguf(path)
    opened = gguf.open_gguf_index(path)  # the tensor table and scalar metadata: gguf-py's reader takes seconds
    assert (len(opened.tensors), opened.arch_value("block_count")) == (num_tensors, num_layers)
    assert json.loads((path.parent / (path.name + ".verified")).read_text())["sha256"] == model.sha256


def test_a_named_model_that_is_not_installed_fails_the_command_with_the_install_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(named.CACHE_DIR_ENV, str(tmp_path))
    monkeypatch.setitem(NAMED_MODELS, "fake", _model())  # its chunk packages are not on sys.path here
    assert main(["generate", "--model", "fake", "Hi"]) == 2
    assert capsys.readouterr().err.strip() == (
        "jido: error: model 'fake' is not installed (missing fake_chunk_part1, fake_chunk_part2, fake_chunk_part3); "
        "install it with: pip install 'jido[fake-extra]'")


def test_an_unknown_name_lists_the_known_ones(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no such file or folder; .* or a model name \(gemma-3-270m, "
                                                r"qwen2.5-coder-0.5b-instruct, qwen2.5-coder-1.5b-instruct; "):
        resolve_model("qwen2.5-coder-7b-instruct", cache_dir=tmp_path)
