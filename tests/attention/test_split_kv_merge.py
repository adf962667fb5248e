"""The split-KV merge inside the attention launch (``paged_attention``, ``fused_reduce``).

The last of a (query block, KV head)'s segments to finish merges them and sets its arrival
counter back to zero. Checked against ``torch_ref`` and against the merge as a second launch
(``fused_reduce=False``) at 1-16 segments, on decodes and verify chunks whose contexts end off
block edges (some segments get no keys at all); the counters are zero after every launch, so a
workspace serves launch after launch (every layer of a step) and replays of a captured graph.
Under ``TRITON_INTERPRET=1`` where there is no GPU; ``cuda``-marked tests also count launches
and replay a graph.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:  # before anything imports triton (it reads this once, at import)
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from tests.attention.paged_cases import make_batch, reference, rel_err  # noqa: E402

# (context, query tokens): decodes and verify chunks, contexts off block edges, one empty context.
SEQS = [(100, 1), (63, 1), (0, 1), (47, 3), (200, 2), (15, 1)]
TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
interpreted = pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")


def _batch(dtype, device, *, heads=4, kv_heads=2, head_size=32, seed=0, seqs=SEQS):
    """A batch with its K/V already in the cache (the write is not under test here)."""
    from octavo.attention.backends.torch_ref import write_kv

    q, k, v, cache, md = make_batch(seqs, num_heads=heads, num_kv_heads=kv_heads, head_size=head_size,
                                    block_size=16, dtype=dtype, device=device, seed=seed)
    ref, _ = reference(q, k, v, cache, md, head_size**-0.5)
    write_kv(k, v, cache, md.slot_mapping)
    return q, cache, md, ref


def _attend(q, cache, md, segments, *, fused=True, workspace=None, tile=16):
    from octavo.attention.ops.paged_attention import paged_attention

    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    paged_attention(q, cache, out, md.query_start_loc, md.seq_lens, md.block_table, md.num_reqs,
                    md.max_query_len, q.shape[-1] ** -0.5, num_segments=segments, workspace=workspace,
                    tile=tile, fused_reduce=fused)
    return out


@interpreted
@pytest.mark.parametrize("segments", [1, 2, 4, 8, 16])
def test_fused_merge_matches_reference_interpreted(segments):
    q, cache, md, ref = _batch(torch.float32, "cpu")
    out = _attend(q, cache, md, segments)
    assert not torch.isnan(out).any(), "a row was never merged"
    assert rel_err(out, ref) < TOL[torch.float32]
    separate = _attend(q, cache, md, segments, fused=False)
    torch.testing.assert_close(out, separate, rtol=1e-6, atol=1e-6)  # float32 summation order only


@interpreted
def test_counters_reset_between_launches_interpreted():
    """One workspace, two launches on different data: both right, counters zero after each
    (a counter left at 1 would make the next launch's last arrival miss the merge: NaN rows)."""
    from octavo.attention.ops.paged_attention import alloc_workspace

    q, cache, md, ref = _batch(torch.float32, "cpu")
    ws = alloc_workspace(q.shape[0], q.shape[1], q.shape[2], 8, "cpu")
    assert len(ws) == 4 and not ws[3].any()
    for seed in (0, 1):
        q, cache, md, ref = _batch(torch.float32, "cpu", seed=seed)
        out = _attend(q, cache, md, 8, workspace=ws)
        assert not ws[3].any(), "arrival counters not reset"
        assert rel_err(out, ref) < TOL[torch.float32]


@interpreted
def test_group_larger_than_a_block_interpreted():
    """7 query heads per KV head (block of 16 rows = 2 tokens), head size 80 padded to 128."""
    q, cache, md, ref = _batch(torch.float32, "cpu", heads=7, kv_heads=1, head_size=80)
    out = _attend(q, cache, md, 4)
    assert rel_err(out, ref) < TOL[torch.float32]


def test_workspace_is_checked():
    from octavo.attention.ops.paged_attention import alloc_workspace

    q, cache, md, _ = _batch(torch.float32, "cpu", seqs=[(40, 1)])
    ws = alloc_workspace(1, 4, 32, 4, "cpu")
    with pytest.raises(ValueError, match="counters"):
        _attend(q, cache, md, 4, workspace=(*ws[:3], ws[3][:1]))
    with pytest.raises(ValueError, match="alloc_workspace"):
        _attend(q, cache, md, 4, workspace=ws[:3])
    with pytest.raises(ValueError, match="too small"):
        _attend(q, cache, md, 8, workspace=ws)
    with pytest.raises(ValueError, match="power of two"):
        _attend(q, cache, md, 3)


# -- GPU ----------------------------------------------------------------------------------

@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("segments", [2, 4, 8, 16])
@pytest.mark.parametrize("head_size", [64, 128, 256])
def test_fused_merge_gpu(dtype, segments, head_size):
    seqs = SEQS + [(3000, 1), (1023, 4), (767, 1)]
    q, cache, md, ref = _batch(dtype, "cuda", heads=32, kv_heads=8, head_size=head_size, seqs=seqs,
                               seed=segments * head_size)
    for tile in (None, 16):
        out = _attend(q, cache, md, segments, tile=tile)
        assert not torch.isnan(out).any()
        assert rel_err(out, ref) < TOL[dtype]
        separate = _attend(q, cache, md, segments, fused=False, tile=tile)
        assert rel_err(out, separate) < (1e-6 if dtype == torch.float32 else 1e-2)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_split_kv_is_one_launch_gpu():
    """Split-KV attention is one kernel with the merge fused, two without."""
    from octavo.attention.ops.paged_attention import alloc_workspace, paged_attention

    q, cache, md, _ = _batch(torch.bfloat16, "cuda", heads=32, kv_heads=8, head_size=128, seqs=[(767, 1)])
    ws, out = alloc_workspace(1, 32, 128, 16, "cuda"), torch.empty_like(q)
    for fused, want in ((True, ["_paged_attention_kernel"]),
                        (False, ["_paged_attention_kernel", "_reduce_segments_kernel"])):
        def launch(fused=fused):
            paged_attention(q, cache, out, md.query_start_loc, md.seq_lens, md.block_table, 1, 1,
                            128**-0.5, num_segments=16, workspace=ws, fused_reduce=fused)

        launch()  # compile outside the profile
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            launch()
            torch.cuda.synchronize()
        names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
        assert names == want


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_fused_merge_replays_from_a_graph_gpu():
    from octavo.attention.ops.paged_attention import alloc_workspace, paged_attention

    q, cache, md, _ = _batch(torch.bfloat16, "cuda", heads=32, kv_heads=8, head_size=128,
                             seqs=[(1500, 1), (900, 1)])
    ws = alloc_workspace(q.shape[0], 32, 128, 16, "cuda")
    out = torch.empty_like(q)

    def step():
        paged_attention(q, cache, out, md.query_start_loc, md.seq_lens, md.block_table, md.num_reqs,
                        md.max_query_len, 128**-0.5, num_segments=16, workspace=ws)

    step()  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for seed in range(4):
        q2, cache2, md2, ref = _batch(torch.bfloat16, "cuda", heads=32, kv_heads=8, head_size=128,
                                      seqs=[(1500, 1), (900, 1)], seed=seed + 1)
        q.copy_(q2)
        cache.copy_(cache2)
        md.block_table.copy_(md2.block_table)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert not ws[3].any()
        assert rel_err(out, ref) < TOL[torch.bfloat16]
