"""An fp8 KV cache (``--kv-cache-dtype fp8`` / ``fp8_e4m3`` / ``fp8_e5m2``) in the Triton
kernels: the write stores ``x / scale`` rounded to the format and saturated at its largest
value; attention reads ``q * scale`` and matches the float64 reference over the same
(dequantized) cache, in mixed prefill/decode batches, GQA and split-KV.

Under ``TRITON_INTERPRET=1`` the attention kernel reads caches written by torch, in float32
and float16 (the interpreter has no bfloat16): its conversions *to* fp8 round some values
wrongly (-7.78 to -4.0 in e4m3, 30.7 to 16.0 in e5m2; torch and the GPU give -8.0 and 32.0), so
the write is checked on the GPU only."""

from __future__ import annotations

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton")

from tests.attention.paged_cases import make_batch, rel_err  # noqa: E402

FORMATS = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
DEVICE = "cuda" if HAS_GPU else "cpu"


def _quantize(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    m = torch.finfo(dtype).max
    return (x.float() / scale).clamp(-m, m).to(dtype)


def _case(seqs, dtype, fmt, k_scale, v_scale, *, heads=4, kv_heads=2, head_size=32, block_size=16,
          segments=1, fused=False):
    from octavo.attention.backends.torch_ref import paged_attention_ref
    from octavo.attention.backends.torch_ref import write_kv as ref_write
    from octavo.attention.ops.paged_attention import paged_attention

    q, k, v, cache, md = make_batch(seqs, num_heads=heads, num_kv_heads=kv_heads, head_size=head_size,
                                    block_size=block_size, dtype=dtype, device=DEVICE)
    k, v = 3 * k, 2 * v  # spread over the format's exponents
    fp8 = torch.empty_like(cache, dtype=FORMATS[fmt])
    fp8[0], fp8[1] = _quantize(cache[0], k_scale, fp8.dtype), _quantize(cache[1], v_scale, fp8.dtype)
    slots = md.slot_mapping
    stored = fp8.clone()
    stored[0].view(-1, kv_heads, head_size)[slots] = _quantize(k, k_scale, fp8.dtype)
    stored[1].view(-1, kv_heads, head_size)[slots] = _quantize(v, v_scale, fp8.dtype)
    # the reference attends over exactly what the cache holds, dequantized
    deq = torch.stack([stored[0].double() * k_scale, stored[1].double() * v_scale])
    ref_write(stored[0].view(-1, kv_heads, head_size)[slots].double() * k_scale,
              stored[1].view(-1, kv_heads, head_size)[slots].double() * v_scale, deq, slots)
    scale = head_size**-0.5
    ref = paged_attention_ref(q.double(), deq, md, scale)
    out = torch.full_like(q, float("nan"))
    paged_attention(q, stored, out, md.query_start_loc, md.seq_lens, md.block_table, md.num_reqs,
                    md.max_query_len, scale, num_segments=segments, tile=16 if segments > 1 else None, fused_reduce=fused,
                    k_scale=k_scale, v_scale=v_scale)
    return out, ref, (q, k, v, fp8, md, stored)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("segments,fused", [(1, False), (4, False), (4, True), (16, True)])
def test_attention_reads_the_fp8_cache(fmt, segments, fused):
    seqs = [(0, 5), (17, 1), (30, 12), (15, 1)] if segments == 1 else [(100, 1), (47, 1), (64, 3)]
    for dtype in (torch.float32, torch.bfloat16 if HAS_GPU else torch.float16):
        out, ref, _ = _case(seqs, dtype, fmt, k_scale=0.5, v_scale=1.5, segments=segments,
                          fused=fused)
        assert not torch.isnan(out).any()
        assert rel_err(out, ref) < {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}[dtype]


@pytest.mark.cuda
@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_write_stores_scaled_saturated_values(fmt):
    from octavo.attention.ops.paged_attention import write_kv

    if not HAS_GPU:
        pytest.skip("the Triton interpreter rounds to fp8 wrongly (module docstring)")
    _, _, (q, k, v, fp8, md, stored) = _case([(3, 9), (0, 4)], torch.float32, fmt, 0.5, 1.5)
    k[0, 0, :4] = torch.tensor([1e6, -1e6, 0.0, 7.78], device=k.device)  # saturate; round
    cache = fp8.clone()
    write_kv(k, v, cache, md.slot_mapping, k_scale=0.5, v_scale=1.5)
    slots = md.slot_mapping
    want_k, want_v = _quantize(k, 0.5, fp8.dtype), _quantize(v, 1.5, fp8.dtype)
    assert torch.equal(cache[0].view(-1, *k.shape[1:])[slots].float(), want_k.float())
    assert torch.equal(cache[1].view(-1, *v.shape[1:])[slots].float(), want_v.float())
    m = torch.finfo(fp8.dtype).max
    assert cache[0].view(-1, *k.shape[1:])[slots][0, 0, :2].float().tolist() == [m, -m]


def test_backend_and_platforms_accept_or_refuse_fp8():
    from octavo.attention.backends.cpu_paged import CpuPagedBackend
    from octavo.attention.backends.triton_paged import TritonPagedBackend
    from octavo.attention.kv_cache_dtype import kv_cache_torch_dtype
    from octavo.platforms.cpu import CpuPlatform
    from octavo.platforms.cuda import CudaPlatform

    assert "fp8" in CudaPlatform.supported_kv_cache_dtypes and "fp8" not in CpuPlatform.supported_kv_cache_dtypes
    reasons = TritonPagedBackend.validate(128, torch.bfloat16, "fp8_e5m2", 16, CudaPlatform)
    assert not any("kv_cache_dtype" in r for r in reasons)
    assert any("kv_cache_dtype" in r for r in CpuPagedBackend.validate(64, torch.float32, "fp8", 16, CpuPlatform))
    assert kv_cache_torch_dtype("fp8", torch.bfloat16) == torch.float8_e4m3fn
    assert kv_cache_torch_dtype("auto", torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="kv-cache-dtype.*'int8'"):
        kv_cache_torch_dtype("int8", torch.bfloat16)


def test_cpu_engine_refuses_an_fp8_cache(llama_dir):
    from octavo import LLM

    if HAS_GPU:
        pytest.skip("the CPU platform's refusal")
    with pytest.raises(ValueError, match=r"--kv-cache-dtype \(kv_cache_dtype\) 'fp8' is not supported on cpu"):
        LLM(llama_dir, kv_cache_dtype="fp8")
