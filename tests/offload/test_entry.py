"""Stored KV entries: what was packed unpacks; a flipped byte, a truncation or another model's entry is refused."""
from __future__ import annotations

import pytest

from jido.offload.entry import CorruptEntryError, pack_entry, unpack_entry

FINGERPRINT = bytes(range(16))


def test_an_entry_unpacks_to_its_codec_and_payload():
    codec, payload = unpack_entry(pack_entry(FINGERPRINT, "cachegen", b"payload bytes"), FINGERPRINT)
    assert codec == "cachegen" and bytes(payload) == b"payload bytes"


@pytest.mark.parametrize("damage, message", [
    (lambda e: e[:-1] + bytes([e[-1] ^ 1]), "checksum mismatch"),
    (lambda e: e[:-3], "header says 13"),
    (lambda e: e[:10], "shorter than its"),
    (lambda e: b"XXXX" + e[4:], "not b'JKV1'"),
])
def test_a_damaged_entry_is_refused(damage, message):
    with pytest.raises(CorruptEntryError, match=message):
        unpack_entry(damage(pack_entry(FINGERPRINT, "raw", b"payload bytes")), FINGERPRINT)


def test_another_models_entry_is_refused():
    with pytest.raises(CorruptEntryError, match="another model"):
        unpack_entry(pack_entry(bytes(16), "raw", b"x"), FINGERPRINT)
