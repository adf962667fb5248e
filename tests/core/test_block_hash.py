"""Block hashes: sha256 over one canonical encoding by default, salt carried down the chain."""

from __future__ import annotations

import hashlib
import struct

import pytest

from octavo.core.block_hash import (
    ROOT_HASH,
    encode_block,
    extend_block_hashes,
    get_hash_function,
)


def test_sha256_is_the_digest_of_the_documented_encoding():
    h = get_hash_function("sha256")
    toks = [5, 7, 150_000, 0]
    expected = hashlib.sha256(
        ROOT_HASH + struct.pack("<I4q", 4, *toks) + struct.pack("<I", 1) + b"s" + struct.pack("<I", 3) + b"abc"
    ).digest()
    assert h(None, toks, ("abc",)) == expected
    child = h(expected, [1, 2, 3, 4], ())
    assert child == hashlib.sha256(expected + struct.pack("<I4q", 4, 1, 2, 3, 4) + struct.pack("<I", 0)).digest()


@pytest.mark.parametrize("a,b", [
    (([1, 2], ()), ([1], (struct.pack("<q", 2),))),  # tokens vs. bytes of an extra key
    (([1, 2], ()), ([1, 2], ("",))),  # an empty salt is a salt
    (([1, 2], ("1",)), ([1, 2], (1,))),  # a str key is not an int key
    (([1, 2], ("ab", "c")), ([1, 2], ("a", "bc"))),  # keys are length-delimited
    (([1, 2], ()), ([2, 1], ())),
])
def test_encoding_is_injective_where_naive_encodings_collide(a, b):
    assert encode_block(None, *a) != encode_block(None, *b)
    h = get_hash_function("sha256")
    assert h(None, *a) != h(None, *b)


def test_unhashable_extra_key_and_unknown_algo_are_errors():
    with pytest.raises(TypeError, match="extra key"):
        encode_block(None, [1], (1.5,))
    with pytest.raises(ValueError, match="--prefix-caching-hash-algo"):
        get_hash_function("builtin")


def test_salt_reaches_every_block_through_the_chain():
    h = get_hash_function("sha256")
    toks = list(range(12))
    salted, plain = [], []
    extend_block_hashes(salted, toks, 4, "tenant", h)
    extend_block_hashes(plain, toks, 4, None, h)
    assert len(salted) == len(plain) == 3
    assert all(s != p for s, p in zip(salted, plain, strict=True))
    more = list(salted[:2])  # extending continues the same chain
    extend_block_hashes(more, toks, 4, "tenant", h)
    assert more == salted


def test_xxhash_is_keyed_per_process():
    pytest.importorskip("xxhash")
    a, b = get_hash_function("xxhash"), get_hash_function("xxhash")
    assert a(None, [1, 2, 3], ()) == a(None, [1, 2, 3], ())
    assert len(a(None, [1, 2, 3], ())) == 16
    assert a(None, [1, 2, 3], ()) != b(None, [1, 2, 3], ())  # independent secret seeds


def test_flag_reaches_the_config_and_is_validated(llama_dir):
    from octavo.engine.arg_utils import EngineArgs

    assert EngineArgs(model=llama_dir).create_engine_config().cache_config.prefix_caching_hash_algo == "sha256"
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        EngineArgs(model=llama_dir, prefix_caching_hash_algo="md5").create_engine_config()
