"""Sliding-window attention and logit soft-capping in every backend that implements them.

The reference is dense float64 attention per request written out here (not ``torch_ref``), so
``torch_ref`` itself is checked too. Blocks wholly outside every query's window are pointed at
the null block filled with NaN: a kernel that read one would return NaN.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from octavo import cpu_isa
from octavo.attention.backends.torch_ref import paged_attention_ref, write_kv
from tests.attention.paged_cases import make_batch, rel_err

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

BS = 16
# (context, query): decodes far past the window, chunks crossing it, a prefill from scratch
# longer than the window, short ones inside it.
SEQS = [(100, 1), (70, 20), (0, 45), (3, 2), (47, 1), (33, 17)]
WINDOW = 24
CAP = 5.0


def _batch(dtype, heads=4, kv_heads=2, head_size=32, seed=0):
    q, k, v, cache, md = make_batch(SEQS, num_heads=heads, num_kv_heads=kv_heads, head_size=head_size,
                                    block_size=BS, dtype=dtype, seed=seed)
    return q, k, v, cache, md


def _poison_outside_window(cache: torch.Tensor, md, window: int) -> None:
    """Point block-table entries wholly before every query's window at block 0, filled with NaN."""
    cache[:, 0] = float("nan")
    for i in range(md.num_reqs):
        q_len = int(md.query_start_loc_cpu[i + 1] - md.query_start_loc_cpu[i])
        first_q = int(md.seq_lens_cpu[i]) - q_len
        dead = max(0, first_q - window + 1) // BS
        md.block_table[i, :dead] = 0


def dense_reference(q, k, v, cache, md, scale, window=None, cap=None):
    """Per request, all keys through the block table, masks written out, float64."""
    c = cache.double().clone()
    write_kv(k.double(), v.double(), c, md.slot_mapping)
    out = torch.zeros(q.shape, dtype=torch.float64)
    hk, d = c.shape[3], c.shape[4]
    group = q.shape[1] // hk
    for i in range(md.num_reqs):
        qs, qe = int(md.query_start_loc_cpu[i]), int(md.query_start_loc_cpu[i + 1])
        n = int(md.seq_lens_cpu[i])
        blocks = md.block_table[i, : -(-n // BS)].long()
        keys = c[0, blocks].reshape(-1, hk, d)[:n].repeat_interleave(group, 1)
        vals = c[1, blocks].reshape(-1, hk, d)[:n].repeat_interleave(group, 1)
        for j in range(qe - qs):
            p = n - (qe - qs) + j
            s = torch.einsum("hd,khd->hk", q[qs + j].double(), keys) * scale
            if cap:
                s = cap * torch.tanh(s / cap)
            lo = p - window + 1 if window else 0
            ok = (torch.arange(n) <= p) & (torch.arange(n) >= lo)
            s[:, ~ok] = float("-inf")
            out[qs + j] = torch.einsum("hk,khd->hd", torch.softmax(s, -1), vals)
    return out


@pytest.mark.parametrize("window,cap", [(WINDOW, None), (None, CAP), (WINDOW, CAP), (16, None)])
def test_torch_ref(window, cap):
    q, k, v, cache, md = _batch(torch.float32)
    ref = dense_reference(q, k, v, cache, md, 32**-0.5, window, cap)
    if window:
        _poison_outside_window(cache, md, window)
    c = cache.clone()
    write_kv(k, v, c, md.slot_mapping)
    out = paged_attention_ref(q, c, md, 32**-0.5, window, cap)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < 1e-6


def _cpu_variants() -> list[str]:
    if cpu_isa.extension_unavailable_reason() is not None:
        return []
    return cpu_isa.usable_variants()


@pytest.mark.parametrize("variant", _cpu_variants())
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("window,cap", [(WINDOW, None), (None, CAP), (WINDOW, CAP), (16, None)])
def test_cpu_paged(variant, dtype, window, cap):
    from octavo.attention.backends.cpu_paged import build_cpu_metadata, cache_from_reference

    q, k, v, cache, md = _batch(dtype, head_size=64)
    scale = 64**-0.5
    ref = dense_reference(q, k, v, cache, md, scale, window, cap)
    if window:
        _poison_outside_window(cache, md, window)
    ext = cpu_isa.load_variant(variant)
    c = cache_from_reference(cache)
    m = build_cpu_metadata(md)
    n = md.num_actual_tokens
    ext.write_kv(key=k, value=v, kv_cache=c, slot_mapping=m.slot_mapping[:n])
    out = torch.full_like(q, float("nan"))
    ext.paged_attention(
        query=q, out=out, kv_cache=c, query_start_loc=m.query_start_loc, seq_lens=m.seq_lens,
        block_table=m.block_table, scale=scale, sliding_window=window or 0, soft_cap=cap or 0.0,
    )
    assert not torch.isnan(out).any(), "read a block outside the window, or left output unwritten"
    assert rel_err(out, ref) < (2e-6 if dtype == torch.float32 else 1e-2)


def _check_triton(device: str, dtype, segments: int, window, cap, tol: float, fused: bool = False) -> None:
    pytest.importorskip("triton")
    from octavo.attention.ops.paged_attention import paged_attention
    from octavo.attention.ops.paged_attention import write_kv as triton_write_kv

    seqs = SEQS if segments == 1 else [(100, 1), (47, 3), (3, 2)]  # split-KV: decode and verify chunks
    kw = dict(num_heads=4, num_kv_heads=2, head_size=32, block_size=BS, dtype=dtype, seed=1)
    q, k, v, cache, md = make_batch(seqs, **kw)  # the same data on the CPU for the reference
    ref = dense_reference(q, k, v, cache, md, 32**-0.5, window, cap)
    q, k, v, cache, md = make_batch(seqs, device=device, **kw)
    if window:
        _poison_outside_window(cache, md, window)
    triton_write_kv(k, v, cache, md.slot_mapping)
    out = torch.full_like(q, float("nan"))
    paged_attention(q, cache, out, md.query_start_loc, md.seq_lens, md.block_table, md.num_reqs,
                    md.max_query_len, 32**-0.5, num_segments=segments, tile=16, fused_reduce=fused,
                    sliding_window=window, logits_soft_cap=cap)
    assert not torch.isnan(out).any()
    assert rel_err(out, ref) < tol


CASES = [(WINDOW, None), (WINDOW, CAP), (None, CAP)]


@pytest.mark.skipif(torch.cuda.is_available(), reason="interpreter tests run where there is no GPU")
@pytest.mark.parametrize("segments,fused", [(1, False), (2, False), (2, True), (8, True)])
@pytest.mark.parametrize("window,cap", CASES)
def test_triton_paged_interpreted(segments, fused, window, cap):
    _check_triton("cpu", torch.float32, segments, window, cap, 1e-5, fused)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("segments,fused", [(1, False), (2, False), (2, True), (8, True)])
@pytest.mark.parametrize("window,cap", CASES)
def test_triton_paged_gpu(dtype, segments, fused, window, cap):
    _check_triton("cuda", dtype, segments, window, cap, 1e-5 if dtype == torch.float32 else 2e-2, fused)


def test_backend_without_support_refuses():
    from octavo.attention.backend import AttentionImpl

    class NoWindow(AttentionImpl):
        pass

    with pytest.raises(ValueError, match="does not implement sliding-window attention"):
        NoWindow(4, 32, 1.0, 2, sliding_window=8)
    with pytest.raises(ValueError, match="soft-capping"):
        NoWindow(4, 32, 1.0, 2, logits_soft_cap=30.0)
    assert NoWindow(4, 32, 1.0, 2).sliding_window is None


def test_dense_reference_is_not_trivial():
    """The window changes the result on this batch (the tests above could not pass by ignoring it)."""
    q, k, v, cache, md = _batch(torch.float32)
    full = dense_reference(q, k, v, cache, md, 32**-0.5)
    win = dense_reference(q, k, v, cache, md, 32**-0.5, WINDOW)
    assert rel_err(win, full) > 1e-2
    assert np.all(md.seq_lens_cpu[[0, 1]] > 3 * BS)


def _group_backends() -> list[str]:
    names = ["torch_ref"]
    if cpu_isa.extension_unavailable_reason() is None:
        names.append("cpu_paged")
    try:
        import triton  # noqa: F401

        names.append("triton_paged")  # interpreted on the CPU (TRITON_INTERPRET=1), else on the GPU
    except ImportError:
        pass
    return names


def _second_group(md, cache, offset: int):
    """Group 1 of a mixed model: the same batch on other blocks of the same KV tensor."""
    import dataclasses

    bt = md.block_table.clone()
    bt[bt != 0] += offset
    pos_block = (md.slot_mapping // BS).long()
    slots = (pos_block + offset) * BS + md.slot_mapping % BS
    return dataclasses.replace(md, block_table=bt, slot_mapping=slots)


@pytest.mark.parametrize("backend", _group_backends())
def test_kv_cache_groups_read_their_own_block_table(backend):
    """A full-attention layer (group 0) and a windowed layer (group 1) share one KV tensor
    positionally but read different blocks: each takes its group's metadata out of the step's
    ``KVGroupMetadata``; the windowed group's blocks behind the window are the NaN null block."""
    from octavo.attention.backend import KVGroupMetadata
    from octavo.attention.backends.cpu_paged import CpuPagedBackend, cache_from_reference
    from octavo.attention.backends.torch_ref import TorchRefBackend
    from octavo.attention.backends.triton_paged import TritonPagedBackend
    from octavo.models.llama import Attention

    cls = {"torch_ref": TorchRefBackend, "cpu_paged": CpuPagedBackend, "triton_paged": TritonPagedBackend}[backend]
    device = "cuda" if backend == "triton_paged" and torch.cuda.is_available() else "cpu"
    q, k, v, cache, md0 = make_batch(SEQS, num_heads=4, num_kv_heads=2, head_size=32, block_size=BS,
                                     dtype=torch.float32, seed=3)
    nb = cache.shape[1]
    other = torch.randn(cache.shape, generator=torch.Generator().manual_seed(4))
    cache = torch.cat([cache, other[:, 1:]], dim=1)  # group 1's blocks: nb .. 2 nb - 2
    md1 = _second_group(md0, cache, nb - 1)
    scale = 32**-0.5
    refs = [dense_reference(q, k, v, cache, md0, scale), dense_reference(q, k, v, cache, md1, scale, WINDOW)]
    assert rel_err(refs[0], refs[1]) > 1e-2  # the two groups do read different KV
    _poison_outside_window(cache, md1, WINDOW)
    kv = cache_from_reference(cache) if backend == "cpu_paged" else cache
    moved = [_to_device(md, device) for md in (md0, md1)]
    step_md = KVGroupMetadata([cls.build_metadata(md) for md in moved])
    kv = kv.to(device)
    impl = cls.get_impl_cls()
    for group, window in ((0, None), (1, WINDOW)):
        layer = Attention(impl(4, 32, scale, 2, sliding_window=window))
        layer.kv_cache, layer.kv_group = kv, group
        out = layer(q.to(device), k.to(device), v.to(device), step_md).cpu()
        assert not torch.isnan(out).any(), f"group {group} read a block outside its window or table"
        assert rel_err(out, refs[group]) < 1e-5, f"group {group}"


def _to_device(md, device: str):
    """``md`` with its tensors on ``device`` (the host copies stay numpy)."""
    import dataclasses

    return dataclasses.replace(md, **{f.name: getattr(md, f.name).to(device) for f in dataclasses.fields(md)
                                      if isinstance(getattr(md, f.name), torch.Tensor)})
