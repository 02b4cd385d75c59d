"""Shared values are made once per key while held, made again once every holder has gone, and keyed by file."""
from __future__ import annotations

import gc
import threading
from pathlib import Path

from jido.utils.shared_values import SharedValues, file_identity


def test_a_value_is_made_once_while_held_and_made_again_after_its_last_holder_goes():
    values: SharedValues[list[int]] = SharedValues()
    made: list[str] = []

    def make(key: str):
        def build() -> list[int]:
            made.append(key)
            return [len(made)]  # a list: not weak-referenceable, as Rust-backed objects often are not
        return build

    first = values.get("a", make("a"))
    second = values.get("a", make("a"))
    other = values.get("b", make("b"))
    assert first is second and first.value is second.value and other.value is not first.value
    assert made == ["a", "b"] and set(values.keys()) == {"a", "b"}
    del first
    assert values.get("a", make("a")).value == [1]  # the second holder still holds it (the temporary goes at once)
    del second
    gc.collect()
    assert set(values.keys()) == {"b"}
    assert values.get("a", make("a")).value == [3] and made == ["a", "b", "a"]


def test_threads_asking_at_once_get_one_value_made_once():
    values: SharedValues[object] = SharedValues()
    calls = []
    start = threading.Barrier(8)
    got = []

    def ask() -> None:
        start.wait()
        got.append(values.get("k", lambda: calls.append(1) or object()))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len({id(shared.value) for shared in got}) == 1


def test_a_rewritten_file_has_another_identity(tmp_path: Path):
    path = tmp_path / "tokenizer.json"
    path.write_text("{}")
    before = file_identity(path)
    assert file_identity(tmp_path / "." / "tokenizer.json") == before
    path.write_text('{"a": 1}')
    assert file_identity(path) != before and file_identity(path)[0] == str(path.resolve())
