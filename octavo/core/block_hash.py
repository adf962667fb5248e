"""Chained block hashes for prefix caching.

``hash_block(parent, token_ids, extra_keys)`` identifies a full block by everything that
determines its KV: the whole prefix (through the parent hash), its own tokens, and extra keys
(``cache_salt`` on the first block, later LoRA or multimodal ids). Two requests share a block
only when every one of those matches.

Two hash functions: ``builtin`` (Python's tuple hash, deterministic for ints across processes,
64-bit, fast) and ``sha256`` (collision resistant, slower). ``OCTAVO_PREFIX_HASH`` picks one.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Any

BlockHash = Any  # int for builtin, bytes for sha256

# Seed of the chain: fixed, so hashes agree across processes of one deployment.
ROOT_HASH_BUILTIN = 0x6F637461766F  # "octavo"
ROOT_HASH_SHA256 = hashlib.sha256(b"octavo-root").digest()


def _builtin_hash(parent: BlockHash | None, token_ids: Sequence[int], extra: tuple) -> int:
    return hash((ROOT_HASH_BUILTIN if parent is None else parent, tuple(token_ids), extra))


def _sha256_hash(parent: BlockHash | None, token_ids: Sequence[int], extra: tuple) -> bytes:
    h = hashlib.sha256(ROOT_HASH_SHA256 if parent is None else parent)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    h.update(repr(extra).encode())
    return h.digest()


HASH_FUNCTIONS: dict[str, Callable[[BlockHash | None, Sequence[int], tuple], BlockHash]] = {
    "builtin": _builtin_hash,
    "sha256": _sha256_hash,
}


def get_hash_function(name: str) -> Callable[[BlockHash | None, Sequence[int], tuple], BlockHash]:
    try:
        return HASH_FUNCTIONS[name]
    except KeyError:
        raise ValueError(
            f"OCTAVO_PREFIX_HASH must be one of {sorted(HASH_FUNCTIONS)}, got {name!r}"
        ) from None


def extend_block_hashes(
    block_hashes: list[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    cache_salt: str | None,
    hash_fn: Callable[[BlockHash | None, Sequence[int], tuple], BlockHash],
) -> None:
    """Append the hashes of full blocks of ``token_ids`` not yet in ``block_hashes`` (in place)."""
    num_full = len(token_ids) // block_size
    for i in range(len(block_hashes), num_full):
        parent = block_hashes[i - 1] if i > 0 else None
        extra = (cache_salt,) if (i == 0 and cache_salt is not None) else ()
        block_hashes.append(hash_fn(parent, token_ids[i * block_size : (i + 1) * block_size], extra))
