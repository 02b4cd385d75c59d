"""prefix_hashes: the router's chained hashes of prompt text, what its pools' prefix affinity is keyed on.

The router never tokenizes, so it hashes the prompt's text in chunks of ``block_chars`` characters, each
hash chained to the one before (as KV blocks are): a prompt that shares a prefix with an earlier one shares
its leading hashes, and the instance that served the longest such chain most likely still has that prefix
in its KV cache (:class:`jido.utils.prefix_affinity.PrefixAffinity` remembers which instance that is).
"""
from __future__ import annotations

import hashlib


def prefix_hashes(text: str, block_chars: int) -> list[bytes]:
    """Chained hashes of the text's full chunks of ``block_chars`` characters."""
    hashes, parent = [], b""
    for start in range(0, len(text) - block_chars + 1, block_chars):
        parent = hashlib.sha1(parent + text[start:start + block_chars].encode("utf-8", "surrogatepass")).digest()
        hashes.append(parent)
    return hashes
