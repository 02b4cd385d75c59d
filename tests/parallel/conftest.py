"""Fixtures of the parallelism tests: tiny checkpoints of every family, and their single-process greedy tokens."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The helpers of tests/models (tiny configs) and tests/server (the in-process server, `jido serve` processes),
# importable under the names those folders' own tests use, whichever folder pytest collects first.
for _folder in ("models", "server"):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / _folder))

from jido import LLM
from parallel_prompts import greedy_tokens
from tiny_families import write_family_folder

@pytest.fixture(scope="session")
def family_folder(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folders = {}

    def folder(arch: str) -> Path:
        if arch not in folders:
            folders[arch] = write_family_folder(tmp_path_factory.mktemp(f"tiny-{arch}"), arch)
        return folders[arch]

    return folder


@pytest.fixture(scope="session")
def single_process_tokens(family_folder) -> dict[str, list[list[int]]]:
    """The reference: each family's greedy tokens from one in-process worker, in float32."""
    cache: dict[str, list[list[int]]] = {}

    def tokens(arch: str) -> list[list[int]]:
        if arch not in cache:
            cache[arch] = greedy_tokens(LLM(str(family_folder(arch)), dtype="float32", kv_cache_memory="4MiB"))
        return cache[arch]

    return tokens
