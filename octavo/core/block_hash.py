"""Chained block hashes for prefix caching.

``hash_fn(parent, token_ids, extra_keys)`` identifies a full block by everything that determines
its KV: the whole prefix (through the parent hash), its own tokens, and extra keys
(``cache_salt`` on the first block, later LoRA or multimodal ids). Two requests share a block
only when every one of those matches.

A hit is trusted without comparing tokens, so the hash must not collide. Each algorithm hashes
one canonical byte encoding of the block (``encode_block``): the parent digest, the token count
and the tokens as little-endian int64, then each extra key with a type tag and a length. No two
different blocks encode to the same bytes, so a hit means equal inputs up to the hash's own
collision probability.

``--prefix-caching-hash-algo`` (vLLM's flag) picks the algorithm:
- ``sha256`` (default): cryptographic; collisions are infeasible even for a client that
  chooses its prompts to attack another tenant's cache.
- ``xxhash``: 128-bit XXH3 keyed with a random per-process secret seed (the cache lives in one
  process, so hashes never need to agree across processes). Faster; accidental collisions are
  negligible (2^-64 after 2^32 blocks) and the secret seed keeps chosen-prompt collisions out
  of reach in practice, but it is not a cryptographic guarantee. Needs the ``xxhash`` package.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Sequence
from functools import lru_cache

BlockHash = bytes
HashFn = Callable[[BlockHash | None, Sequence[int], tuple], BlockHash]

# Seed of the chain (the parent of block 0): fixed, 32 bytes like every other parent.
ROOT_HASH = hashlib.sha256(b"octavo-prefix-cache-root").digest()

_TAGS = {str: b"s", bytes: b"b", int: b"i"}


@lru_cache(maxsize=64)
def _tokens_struct(n: int) -> struct.Struct:
    return struct.Struct(f"<I{n}q")


def _encode_extra(extra: tuple) -> bytes:
    parts = [struct.pack("<I", len(extra))]
    for key in extra:
        tag = _TAGS.get(type(key))
        if tag is None:
            raise TypeError(f"prefix-cache extra key {key!r}: only str, bytes and int are hashed")
        raw = key.encode() if isinstance(key, str) else key if isinstance(key, bytes) else struct.pack("<q", key)
        parts += [tag, struct.pack("<I", len(raw)), raw]
    return b"".join(parts)


def encode_block(parent: BlockHash | None, token_ids: Sequence[int], extra: tuple) -> bytes:
    """The canonical bytes of one block: injective in (parent, tokens, extra keys)."""
    head = ROOT_HASH if parent is None else parent
    body = _tokens_struct(len(token_ids)).pack(len(token_ids), *token_ids)
    return head + body + (_encode_extra(extra) if extra else b"\0\0\0\0")


def _sha256(parent: BlockHash | None, token_ids: Sequence[int], extra: tuple) -> BlockHash:
    return hashlib.sha256(encode_block(parent, token_ids, extra)).digest()


def _make_xxhash() -> HashFn:
    try:
        import xxhash
    except ImportError:
        raise ValueError(
            "--prefix-caching-hash-algo (prefix_caching_hash_algo) xxhash needs the 'xxhash' "
            "package (pip install xxhash), or use sha256"
        ) from None
    seed = int.from_bytes(os.urandom(8), "little")
    xxh3 = xxhash.xxh3_128_digest

    def _xxhash(parent: BlockHash | None, token_ids: Sequence[int], extra: tuple) -> BlockHash:
        return xxh3(encode_block(parent, token_ids, extra), seed=seed)

    return _xxhash


HASH_ALGOS = ("sha256", "xxhash")


def get_hash_function(name: str) -> HashFn:
    """The block hash function of ``--prefix-caching-hash-algo``; ValueError for another name."""
    if name == "sha256":
        return _sha256
    if name == "xxhash":
        return _make_xxhash()
    raise ValueError(
        f"--prefix-caching-hash-algo (prefix_caching_hash_algo) must be one of {list(HASH_ALGOS)}, got {name!r}"
    )


def extend_block_hashes(
    block_hashes: list[BlockHash],
    token_ids: Sequence[int],
    block_size: int,
    cache_salt: str | None,
    hash_fn: HashFn,
    kv_key: int | None = None,
) -> None:
    """Append the hashes of full blocks of ``token_ids`` not yet in ``block_hashes`` (in place).

    ``cache_salt`` and ``kv_key`` (what besides the tokens determines the KV, e.g. the prompt
    length for length-dependent RoPE) are extra keys of block 0 only; every later block depends
    on them through the chain, so requests that differ in either share no block at all.
    """
    num_full = len(token_ids) // block_size
    first = tuple(k for k in (cache_salt, kv_key) if k is not None)
    for i in range(len(block_hashes), num_full):
        parent = block_hashes[i - 1] if i > 0 else None
        extra = first if i == 0 else ()
        block_hashes.append(hash_fn(parent, token_ids[i * block_size : (i + 1) * block_size], extra))
