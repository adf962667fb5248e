"""The optional-package backends (flash_attn, ipex, xla) import without their packages, say
"not installed" cleanly, and keep the layouts their kernels read."""

from __future__ import annotations

import importlib

import pytest
import torch

from octavo.attention.backends import (
    BACKENDS,
    PACKAGE_REQUIREMENTS,
    missing_packages,
    resolve_backend,
)
from octavo.platforms.cpu import CpuPlatform


@pytest.mark.parametrize("name", ["flash_attn", "ipex", "xla"])
def test_backend_imports_and_reports_missing_package(name):
    package = PACKAGE_REQUIREMENTS[name][0]
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed here")
    assert missing_packages(name) == [package]
    backend = resolve_backend(name)  # the module itself imports without the package
    assert backend.name == name
    reasons = backend.validate(128, torch.bfloat16, "auto", 256, CpuPlatform)
    assert f"package {package!r} is not installed" in reasons


def test_registry_names_every_backend_the_platforms_use():
    from octavo.platforms import BUILTIN_PLATFORMS, load_platform_class

    for path in BUILTIN_PLATFORMS.values():
        for name in load_platform_class(path).attn_backend_priority:
            assert name in BACKENDS, name


def test_xla_cache_interleaves_k_and_v_per_head():
    from octavo.attention.backends.xla import XlaBackend, write_kv_interleaved

    shape = XlaBackend.get_kv_cache_shape(num_blocks=3, block_size=4, num_kv_heads=2, head_size=8)
    assert shape == (3, 4, 4, 8)
    cache = torch.zeros(shape)
    key, value = torch.randn(2, 2, 8), torch.randn(2, 2, 8)
    write_kv_interleaved(key, value, cache, torch.tensor([5, 11]))  # block 1 slot 1, block 2 slot 3
    for tok, (blk, off) in enumerate([(1, 1), (2, 3)]):
        for h in range(2):
            assert torch.equal(cache[blk, off, 2 * h], key[tok, h])
            assert torch.equal(cache[blk, off, 2 * h + 1], value[tok, h])
    assert cache[0].abs().sum() == 0


def test_varlen_metadata_adds_cumulative_key_lengths():
    import numpy as np

    from octavo.attention.backend import CommonAttentionMetadata
    from octavo.attention.backends.flash_attn import build_varlen_metadata

    common = CommonAttentionMetadata(
        query_start_loc=torch.tensor([0, 3, 4], dtype=torch.int32),
        seq_lens=torch.tensor([3, 9], dtype=torch.int32),
        block_table=torch.zeros(2, 1, dtype=torch.int32),
        slot_mapping=torch.arange(4),
        query_start_loc_cpu=np.array([0, 3, 4]),
        seq_lens_cpu=np.array([3, 9]),
        num_reqs=2, num_actual_tokens=4, max_query_len=3, max_seq_len=9, block_size=16,
    )
    md = build_varlen_metadata(common)
    assert md.cu_seqlens_k.tolist() == [0, 3, 12] and md.cu_seqlens_k.dtype == torch.int32
