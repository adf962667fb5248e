"""Unpacking the integer layouts checkpoints use (int32 words of 4- or 8-bit codes).

- sequential (compressed-tensors ``pack-quantized``, GPTQ): code ``i`` of a word sits at bits
  ``[bits * i, bits * (i + 1))``;
- AWQ (GEMM): the 8 nibbles of a word hold columns ``[0, 2, 4, 6, 1, 3, 5, 7]`` of its group
  of 8, i.e. column ``j`` sits in nibble ``AWQ_NIBBLE[j]``.
"""

from __future__ import annotations

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i holds column AWQ_ORDER[i]
AWQ_NIBBLE = (0, 4, 1, 5, 2, 6, 3, 7)  # column j sits in nibble AWQ_NIBBLE[j]


def unpack_int32(packed: torch.Tensor, bits: int, dim: int, size: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """uint8 codes of ``packed`` (int32) unpacked along ``dim`` to ``size`` entries.

    ``order[j]``: the slot holding entry ``j`` of each word (None: sequential).
    """
    if packed.dtype != torch.int32:
        raise ValueError(f"packed codes must be int32, got {packed.dtype}")
    per = 32 // bits
    slots = torch.arange(per, dtype=torch.int32) if order is None else torch.tensor(order, dtype=torch.int32)
    p = packed.movedim(dim, -1).unsqueeze(-1)  # [..., words, 1]
    codes = (p >> (slots * bits)) & ((1 << bits) - 1)  # [..., words, per]
    codes = codes.flatten(-2)
    if codes.shape[-1] < size:
        raise ValueError(f"packed tensor holds {codes.shape[-1]} codes along dim {dim}, expected {size}")
    return codes[..., :size].to(torch.uint8).movedim(-1, dim).contiguous()


def pack_int32(codes: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Inverse of ``unpack_int32`` (codes padded with zeros to whole words): for online use and tests."""
    per = 32 // bits
    c = codes.to(torch.int64).movedim(dim, -1)
    pad = (-c.shape[-1]) % per
    if pad:
        c = torch.nn.functional.pad(c, (0, pad))
    c = c.reshape(*c.shape[:-1], -1, per)
    slots = torch.arange(per) if order is None else torch.tensor(order)
    words = (c << (slots * bits)).sum(-1)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).movedim(-1, dim).contiguous()
