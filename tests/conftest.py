"""Shared fixtures: the converted default model folder and transformers' reference runs on it."""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from jido import LLM
from jido.models import named
from jido.models.loader import resolve_model
from jido.server.config import API_KEY_ENV

# Triton picks compiled or interpreted kernels when it is imported, once per process: without CUDA, the
# triton attention backend's tests run its kernels on CPU tensors under the interpreter.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE_PATH = FIXTURES / "gemma3_reference.json"
QWEN_REFERENCE_PATH = FIXTURES / "qwen2_reference.json"
QWEN, QWEN_1_5B = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"


@pytest.fixture(scope="session")
def gemma_folder() -> Path:
    """The default Gemma 3 270M GGUF as an HF folder; converted once, then reused from ~/.cache/jido."""
    return resolve_model(None)


@pytest.fixture(scope="session")
def gemma_reference() -> dict:
    """transformers' ids and greedy runs on the same GGUF (made by fixtures/make_gemma3_reference.py)."""
    return json.loads(REFERENCE_PATH.read_text(encoding="utf-8"))


def require_named_model(name: str) -> None:
    """Skip the test, saying what to install, when the named model's chunk packages are missing."""
    model = named.NAMED_MODELS[name]
    if not named.is_installed(model):
        pytest.skip(f"{name} is not installed: {model.install_hint}")


@pytest.fixture(scope="session")
def qwen_folder() -> Path:
    """Qwen2.5-Coder-0.5B-Instruct (the `qwen` extra, which `make test` installs) as an HF folder."""
    require_named_model(QWEN)
    return resolve_model(QWEN)


@pytest.fixture(scope="session")
def qwen_1_5b_folder() -> Path:
    """Qwen2.5-Coder-1.5B-Instruct as an HF folder; optional (`jido[qwen-1-5b]`), so its tests skip without it."""
    require_named_model(QWEN_1_5B)
    return resolve_model(QWEN_1_5B)


@pytest.fixture(scope="session")
def qwen_reference() -> dict:
    """transformers' ids, chat renders and greedy runs on it (made by fixtures/make_qwen2_reference.py)."""
    return json.loads(QWEN_REFERENCE_PATH.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def qwen_llm(qwen_folder: Path) -> Iterator[LLM]:
    """Qwen2.5-Coder-0.5B-Instruct on CPU in float32 on float weights, as ``llm`` holds the default model; per module,
    as few modules use it and it holds 2 GiB."""
    with LLM(model=QWEN, kv_cache_memory="160MiB", dtype="float32", quantization="none") as qwen:
        yield qwen


@pytest.fixture(scope="session")
def llm() -> Iterator[LLM]:
    """The default model on CPU in float32 (explicitly: ``auto`` is bf16 on CPUs with native bf16) on its GGUF's
    dequantized weights (``quantization="none"``: nothing rounded, so it computes what transformers computes;
    the default ``gguf`` kernels round activations and are checked against their own measured error), with a
    KV cache large enough for every test."""
    with LLM(kv_cache_memory="160MiB", dtype="float32", quantization="none") as default:
        yield default


@pytest.fixture(scope="session", autouse=True)
def _no_api_key_from_the_environment() -> Iterator[None]:
    """Servers under test take their key from the test, never from the tester's ``JIDO_API_KEY``."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(API_KEY_ENV, raising=False)
        yield


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Gemma 3 checkpoint with a word-level tokenizer (see tiny_model_folder.py)."""
    from tiny_model_folder import write_tiny_model_folder

    return write_tiny_model_folder(tmp_path_factory.mktemp("tiny-gemma3"))


@pytest.fixture(scope="session")
def draft_for(tmp_path_factory: pytest.TempPathFactory):
    """``draft_for(target, method="eagle")``: an EAGLE draft or Medusa heads trained for a tiny target (once per
    target and method), and the trainer's record."""
    from trained_drafts import train_tiny_draft

    drafts: dict[tuple[Path, str], tuple[Path, dict]] = {}

    def trained_for(target: Path, method: str = "eagle") -> tuple[Path, dict]:
        if (target, method) not in drafts:
            drafts[target, method] = train_tiny_draft(target, tmp_path_factory.mktemp(method), method)
        return drafts[target, method]

    return trained_for


@pytest.fixture(scope="module", autouse=True)
def _engines_collected_after_each_module() -> Iterator[None]:
    """The engines a module made and dropped are collected at its end (their finalizers free the model and KV
    cache), not at some later collection of the oldest generation: the whole suite runs in one process."""
    yield
    gc.collect()


def _resident_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# Resident memory a module left behind (after its module-scoped fixtures closed), summed per module, so the test
# that holds memory is named in the summary instead of found by bisecting the suite.
_MODULE_GROWTH: dict[str, int] = {}
_PEAK_TEST: list[str] = []  # the test during which the process's peak was last raised


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    before, peak = (_resident_bytes(), _peak_kib()) if sys.platform == "linux" else (0, 0)
    yield
    if sys.platform == "linux":
        module = item.nodeid.split("::")[0]
        _MODULE_GROWTH[module] = _MODULE_GROWTH.get(module, 0) + _resident_bytes() - before
        if _peak_kib() > peak:
            _PEAK_TEST[:] = [item.nodeid]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The run's peak resident memory, printed after every run, so the suite's memory is a figure and not a guess;
    then the modules that left the most resident memory behind."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # Linux counts KiB
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # the largest child waited for
    terminalreporter.write_line(f"peak RSS: pytest process {own:.2f} GiB, largest child process {child:.2f} GiB")
    if _PEAK_TEST:
        terminalreporter.write_line(f"  the pytest process's peak was reached in {_PEAK_TEST[0]}")
    if sys.platform == "linux":
        terminalreporter.write_line(f"resident at the end: {_resident_bytes() / 2**30:.2f} GiB")
    top = sorted(_MODULE_GROWTH.items(), key=lambda kv: kv[1], reverse=True)[:8]
    for module, grown in top:
        if grown >= 64 << 20:
            terminalreporter.write_line(f"  {grown / 2**30:+.2f} GiB resident left by {module}")
