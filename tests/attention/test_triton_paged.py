"""The Triton paged-attention kernels against ``torch_ref`` on randomised paged batches.

On a machine without a GPU the kernels run under ``TRITON_INTERPRET=1`` on small shapes; the
``cuda``-marked tests sweep dtypes, head sizes, block sizes, GQA groups and the split-KV
variant on the GPU. Everything skips cleanly when triton is not installed.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from tests.attention.paged_cases import make_batch, reference, rel_err  # noqa: E402

TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def run_triton(query, key, value, kv_cache, md, scale, segments=1, tile=None):
    from octavo.attention.ops.paged_attention import paged_attention, write_kv

    cache = kv_cache.clone()
    write_kv(key, value, cache, md.slot_mapping)
    out = torch.full_like(query, float("nan"))  # poison: every element must be written
    paged_attention(
        query, cache, out, md.query_start_loc, md.seq_lens, md.block_table, md.num_reqs,
        md.max_query_len, scale, num_segments=segments, tile=tile,
    )
    return out, cache


def check(seqs, *, heads, kv_heads, head_size, block_size, dtype, device, segments=1, seed=0, tile=None):
    q, k, v, cache, md = make_batch(
        seqs, num_heads=heads, num_kv_heads=kv_heads, head_size=head_size,
        block_size=block_size, dtype=dtype, device=device, seed=seed,
    )
    scale = head_size**-0.5
    ref_out, ref_cache = reference(q, k, v, cache, md, scale)
    out, new_cache = run_triton(q, k, v, cache, md, scale, segments, tile)
    assert not torch.isnan(out).any(), "unwritten or NaN output"
    # The write is a copy: exact.
    assert torch.equal(new_cache.double().cpu(), ref_cache.to(dtype).double().cpu())
    err = rel_err(out, ref_out)
    assert err < TOL[dtype], f"relative error {err:.2e} for {seqs}"


# -- CPU, under the Triton interpreter (small shapes) -------------------------------------

MIXED = [(0, 5), (17, 1), (30, 12), (0, 1), (15, 1), (31, 3)]


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_mixed_batch_interpreted():
    check(MIXED, heads=4, kv_heads=2, head_size=16, block_size=16, dtype=torch.float32, device="cpu")


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_odd_group_padded_head_interpreted():
    # 7 query heads per KV head (the Qwen2.5-0.5B ratio), head size 80 padded to 128.
    seqs = [(3, 9), (40, 1), (0, 33)]
    check(seqs, heads=7, kv_heads=1, head_size=80, block_size=32, dtype=torch.float16, device="cpu")


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_split_kv_decode_interpreted():
    seqs = [(100, 1), (64, 1), (0, 1), (47, 1)]
    check(seqs, heads=4, kv_heads=2, head_size=32, block_size=16, dtype=torch.float32,
          device="cpu", segments=4, tile=16)


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_split_kv_short_query_chunks_interpreted():
    # Speculative verify steps: a few query tokens per request (causal within the chunk).
    seqs = [(100, 3), (64, 2), (5, 4), (47, 1)]
    check(seqs, heads=4, kv_heads=2, head_size=32, block_size=16, dtype=torch.float32,
          device="cpu", segments=4, tile=16)


def test_split_policy_covers_verify_chunks_not_prefill():
    from octavo.attention.backends.triton_paged import SPLIT_MAX_QUERY_LEN, num_kv_segments

    assert num_kv_segments(1, 8, 1, 4096) > 1
    assert num_kv_segments(1, 8, 5, 4096) == num_kv_segments(1, 8, 1, 4096)
    assert num_kv_segments(1, 8, SPLIT_MAX_QUERY_LEN + 1, 4096) == 1
    assert num_kv_segments(1, 8, 2, 100) == 1  # short contexts: not worth the reduction


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
def test_padding_slots_are_not_written_interpreted():
    from octavo.attention.ops.paged_attention import write_kv

    q, k, v, cache, md = make_batch([(0, 4)], num_heads=2, num_kv_heads=2, head_size=16,
                                    block_size=16, dtype=torch.float32)
    slots = md.slot_mapping.clone()
    slots[2:] = -1
    new = cache.clone()
    write_kv(k, v, new, slots)
    ref = cache.clone()
    from octavo.attention.backends.torch_ref import write_kv as ref_write

    ref_write(k[:2], v[:2], ref, slots[:2])
    assert torch.equal(new, ref)


@pytest.mark.skipif(HAS_GPU, reason="interpreter tests run where there is no GPU")
@pytest.mark.parametrize("pad_tokens", [32, 29])  # a dummy chunk of 3 padding tokens; none
def test_mixed_graph_layout_pads_without_touching_real_rows_interpreted(pad_tokens):
    """A mixed step staged as a captured mixed graph reads it: padded to ``pad_tokens`` tokens
    over every row of the step buffers (a dummy chunk in the row after the real ones, empty
    rows after that), the kernel launched on the graph's static metadata gives the real rows
    torch_ref's output and writes only their slots."""
    import numpy as np

    from octavo.platforms.cpu import CpuPlatform
    from octavo.worker.cuda_graph import StepBuffers

    seqs = [(17, 1), (0, 20), (30, 1), (15, 7)]  # 29 tokens: two chunks among decodes
    q, k, v, cache, md = make_batch(seqs, num_heads=4, num_kv_heads=2, head_size=16, block_size=16,
                                    dtype=torch.float32)
    t = md.num_actual_tokens
    ref_out, ref_cache = reference(q, k, v, cache, md, 16**-0.5)
    buf = StepBuffers(32, 6, 4, 16, torch.device("cpu"), CpuPlatform)
    table = np.zeros((6, 4), dtype=np.int32)
    table[2:6, : md.block_table.shape[1]] = md.block_table.numpy()  # rows 2..5 hold the requests
    qsl = md.query_start_loc_cpu
    positions = np.concatenate([np.arange(c, c + n) for c, n in seqs])
    buf.stage(np.arange(t), positions, [md.slot_mapping.numpy()], qsl, md.seq_lens_cpu, [table],
              np.arange(2, 6), md.block_table.shape[1], int(md.max_query_len), pad_tokens=pad_tokens)
    [gmd] = buf.mixed_graph_metadata(pad_tokens, 64)
    assert buf.qsl[:7].tolist() == qsl.tolist() + [pad_tokens] * 2
    assert buf.sl[:6].tolist() == md.seq_lens_cpu.tolist() + [pad_tokens - t, 0]
    assert (buf.slot[t:pad_tokens] == -1).all()

    def pad(x):  # padding rows: random, as a dummy chunk's activations would be
        return torch.cat([x, torch.randn(pad_tokens - t, *x.shape[1:])])

    out, new_cache = run_triton(pad(q), pad(k), pad(v), cache, gmd, 16**-0.5)
    assert torch.equal(new_cache.double(), ref_cache)
    assert rel_err(out[:t], ref_out) < TOL[torch.float32]
    assert not torch.isnan(out).any()


def test_backend_validate_messages():
    from octavo.attention.backends.triton_paged import TritonPagedBackend
    from octavo.platforms.cuda import CudaPlatform

    reasons = TritonPagedBackend.validate(128, torch.bfloat16, "int8", 16, CudaPlatform)
    assert any("not supported on this backend" in r for r in reasons)
    assert any("head size" in r for r in TritonPagedBackend.validate(12, torch.float16, "auto", 16, CudaPlatform))
    assert any("block size" in r for r in TritonPagedBackend.validate(64, torch.float16, "auto", 8, CudaPlatform))


# -- GPU ----------------------------------------------------------------------------------

def _random_seqs(rng, n, max_ctx, max_q):
    seqs = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.5:
            seqs.append((int(rng.integers(0, max_ctx)), 1))  # decode
        elif kind < 0.8:
            seqs.append((int(rng.integers(0, max_ctx)), int(rng.integers(1, max_q))))  # chunk
        else:
            seqs.append((0, int(rng.integers(1, max_q))))  # fresh prefill
    return seqs


# bf16: every head size x block size; fp16 and fp32: a spread (each case compiles kernels).
GPU_CASES = [(torch.bfloat16, h, b) for h in (64, 80, 96, 128, 256) for b in (16, 32, 64)] + [
    (torch.float16, 64, 16), (torch.float16, 128, 32), (torch.float16, 256, 64),
    (torch.float32, 80, 16), (torch.float32, 96, 32), (torch.float32, 128, 64),
]


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("dtype,head_size,block_size", GPU_CASES)
def test_random_mixed_batches_gpu(dtype, head_size, block_size):
    import numpy as np

    rng = np.random.default_rng(head_size * 1000 + block_size)
    for heads, kv_heads in ((8, 8), (32, 8), (14, 2), (16, 1)):
        seqs = _random_seqs(rng, int(rng.integers(1, 12)), 700, 150)
        # Block-boundary cases: contexts ending exactly at / one past a block edge.
        seqs += [(block_size - 1, 1), (block_size, 1), (2 * block_size, block_size + 1)]
        check(seqs, heads=heads, kv_heads=kv_heads, head_size=head_size,
              block_size=block_size, dtype=dtype, device="cuda", seed=int(rng.integers(1 << 30)))


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("segments", [2, 8, 16])
def test_split_kv_gpu(dtype, segments):
    import numpy as np

    rng = np.random.default_rng(segments)
    for head_size in (64, 128, 256):
        # decodes and speculative-verify chunks (a few query tokens)
        seqs = [(int(rng.integers(0, 3000)), int(rng.integers(1, 9))) for _ in range(int(rng.integers(1, 6)))]
        seqs.append((0, 1))
        check(seqs, heads=32, kv_heads=8, head_size=head_size, block_size=16, dtype=dtype,
              device="cuda", segments=segments, seed=segments * head_size)


@pytest.mark.cuda
@pytest.mark.skipif(not HAS_GPU, reason="needs a GPU")
def test_backend_forward_gpu():
    """The backend's own forward (write + attention + split policy) on a long decode batch."""
    from octavo.attention.backends.triton_paged import TritonPagedBackend

    seqs = [(1500, 1), (900, 1)]
    q, k, v, cache, md = make_batch(seqs, num_heads=32, num_kv_heads=8, head_size=128,
                                    block_size=16, dtype=torch.bfloat16, device="cuda")
    impl = TritonPagedBackend.get_impl_cls()(32, 128, 128**-0.5, 8)
    ref_out, _ = reference(q, k, v, cache, md, 128**-0.5)
    out = impl.forward(q, k, v, cache, TritonPagedBackend.build_metadata(md))
    assert rel_err(out, ref_out) < TOL[torch.bfloat16]
