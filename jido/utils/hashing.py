"""Stable content hashes for KV cache blocks, the same in every process and on every machine."""
from __future__ import annotations

import hashlib
from array import array

BlockHash = bytes
ROOT_BLOCK_HASH: BlockHash = b"jido-root"


def hash_block_tokens(parent_hash: BlockHash | None, token_ids: tuple[int, ...] | list[int]) -> BlockHash:
    """Hash a full block from its parent's hash and its token ids.

    Chaining the parent's hash makes a block's hash name its whole prefix, so equal hashes mean equal
    prefixes (callers still verify tokens on a match, since a hash can collide).
    """
    digest = hashlib.sha256(parent_hash if parent_hash is not None else ROOT_BLOCK_HASH)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()[:16]
