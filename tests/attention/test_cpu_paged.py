"""``cpu_paged`` (octavo's C++ CPU kernels) against ``torch_ref`` on randomised paged batches.

Every ISA variant this machine can run is tested -- forced through ``OCTAVO_CPU_ISA`` as a user
would, plus the plain AVX-512 build on CPUs that also have ``avx512_bf16`` -- for every
supported head size, bf16 and fp32 (fp16 on a subset), mixed prefill / chunked-prefill /
decode batches. The variants this machine cannot run are covered by ``nox -s test-cpu-isa``
(qemu). Skips cleanly when the extension is not built.
"""

from __future__ import annotations

import pytest
import torch

from octavo import cpu_isa

if cpu_isa.extension_unavailable_reason() is not None:
    pytest.skip(f"C++ CPU kernels unavailable: {cpu_isa.extension_unavailable_reason()}", allow_module_level=True)

from octavo.attention.backends.cpu_paged import (  # noqa: E402
    CpuPagedBackend,
    build_cpu_metadata,
    cache_from_reference,
    cache_to_reference,
)
from octavo.platforms.cpu import CpuPlatform  # noqa: E402
from tests.attention.paged_cases import make_batch, reference, rel_err  # noqa: E402

TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1e-2}
HEAD_SIZES = [64, 80, 96, 128, 256]
# (context, query) per request: prefill from scratch, chunked prefill over a cached prefix
# (crossing blocks), decodes at block boundaries, a long-ish context.
MIXED = [(0, 7), (33, 1), (17, 20), (0, 1), (63, 1), (64, 1), (5, 70), (200, 1)]


VARIANTS = cpu_isa.usable_variants()


def run_variant(variant, q, k, v, ref_cache, md, scale, allow_amx=True, fused=False):
    """write_kv, then paged_attention; ``fused``: one paged_attention call that writes too."""
    ext = cpu_isa.load_variant(variant)
    cache = cache_from_reference(ref_cache)
    m = build_cpu_metadata(md)
    slots = m.slot_mapping[: md.num_actual_tokens]
    if not fused:
        ext.write_kv(key=k, value=v, kv_cache=cache, slot_mapping=slots)
    write = {"key": k, "value": v, "slot_mapping": slots} if fused else {}
    out = torch.full_like(q, float("nan"))  # poison: every element must be written
    ext.paged_attention(query=q, out=out, kv_cache=cache, query_start_loc=m.query_start_loc,
                        seq_lens=m.seq_lens, block_table=m.block_table, scale=scale, allow_amx=allow_amx,
                        **write)
    return out, cache_to_reference(cache, q.shape[-1])


def check(variant, seqs, *, heads, kv_heads, head_size, block_size, dtype, seed=0, fused=False):
    q, k, v, cache, md = make_batch(seqs, num_heads=heads, num_kv_heads=kv_heads, head_size=head_size,
                                    block_size=block_size, dtype=dtype, seed=seed)
    scale = head_size**-0.5
    ref_out, ref_cache = reference(q, k, v, cache, md, scale)
    out, new_cache = run_variant(variant, q, k, v, cache, md, scale, fused=fused)
    assert not torch.isnan(out).any(), "unwritten or NaN output"
    assert torch.equal(new_cache.double(), ref_cache.to(dtype).double()), "write_kv is not an exact copy"
    err = rel_err(out, ref_out)
    assert err < TOL[dtype], f"{variant}: relative error {err:.2e} for {seqs}"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("head_size", HEAD_SIZES)
def test_mixed_batch_every_variant(variant, dtype, head_size):
    heads, kv_heads = (8, 2) if head_size < 256 else (4, 2)
    block_size = 16 if head_size in (64, 128) else 32
    check(variant, MIXED, heads=heads, kv_heads=kv_heads, head_size=head_size, block_size=block_size,
          dtype=dtype, seed=head_size)


# decodes only (>= 4: items of every KV head, and of one), a prefill with decodes, chunked
# prefills only: the fused call writes decodes inside their items, the other tokens first
FUSED_BATCHES = {
    "decodes": [(33, 1), (0, 1), (63, 1), (64, 1), (200, 1), (15, 1)],
    "few-decodes": [(47, 1), (16, 1)],
    "mixed": MIXED,
    "prefills": [(0, 7), (17, 20), (5, 70)],
}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("batch", sorted(FUSED_BATCHES))
def test_attention_that_writes_the_kv_itself(variant, dtype, batch):
    """paged_attention(key=, value=, slot_mapping=) == write_kv then paged_attention: the same
    cache, the torch_ref output."""
    check(variant, FUSED_BATCHES[batch], heads=6, kv_heads=3, head_size=64, block_size=16, dtype=dtype,
          seed=len(batch), fused=True)


def test_fused_write_refuses_mismatched_kv():
    ext, args, k, v, m = _boundary_case()
    with pytest.raises(ValueError, match="key .* does not have the cache's KV heads"):
        ext.paged_attention(**args, key=k[:, :1], value=v[:, :1], slot_mapping=m.slot_mapping)
    with pytest.raises(ValueError, match="slot_mapping"):
        ext.paged_attention(**args, key=k, value=v)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("block_size", [16, 48, 64, 128])
def test_block_sizes_fp16(variant, block_size):
    check(variant, MIXED, heads=6, kv_heads=3, head_size=64, block_size=block_size, dtype=torch.float16,
          seed=block_size)


def nan_past_the_ends(cache, md):
    """A copy of the reference-layout cache with NaN in every slot past a sequence's end."""
    cache = cache.clone()
    bs = cache.shape[2]
    for i, n in enumerate(md.seq_lens_cpu.tolist()):
        if n % bs:
            cache[:, int(md.block_table[i, (n - 1) // bs]), n % bs:] = float("nan")
    return cache


# (heads, kv_heads, head_size, block_size, seqs): GQA groups of 1, 3, 16 and 24 (24: decode
# items of several heads take the vector path, one-head prefill tiles the AMX one); query tiles
# whose rows end inside a row tile; >= 4 decodes, so decode items cover every KV head.
AMX_CASES = [
    (9, 3, 64, 16, [(0, 70), (33, 50), (250, 1), (17, 1), (64, 1), (5, 1), (100, 1), (31, 1)]),
    (4, 4, 128, 16, [(0, 130), (20, 9), (47, 1), (3, 1), (90, 1), (16, 1)]),
    (32, 2, 64, 48, [(0, 9), (40, 1), (7, 20), (1, 1), (95, 1), (2, 1)]),
    (48, 2, 64, 16, [(0, 5), (40, 1), (7, 3), (1, 1), (95, 1), (2, 1)]),
    (8, 2, 96, 64, MIXED),
    (4, 2, 256, 32, MIXED),
]


@pytest.mark.parametrize("allow_amx", [True, False], ids=["amx", "vector"])
@pytest.mark.parametrize("case", AMX_CASES, ids=lambda c: f"h{c[0]}-kv{c[1]}-d{c[2]}-bs{c[3]}")
def test_bf16_amx_and_vector_paths(case, allow_amx):
    """avx512_bf16 on bf16 runs Q.K^T and P.V on AMX tiles where the CPU has them, else (and with
    allow_amx=False) VDPBF16PS: both against torch_ref, with NaN in the unwritten slots past each
    sequence's end (a zero probability times NaN there would poison a tile product)."""
    if "avx512_bf16" not in VARIANTS:
        pytest.skip("the avx512_bf16 variant does not run here")
    if allow_amx and not cpu_isa.load_variant("avx512_bf16").attention_amx():
        pytest.skip("no AMX tiles on this CPU")
    heads, kv_heads, head_size, block_size, seqs = case
    q, k, v, cache, md = make_batch(seqs, num_heads=heads, num_kv_heads=kv_heads, head_size=head_size,
                                    block_size=block_size, dtype=torch.bfloat16, seed=head_size + heads)
    scale = head_size**-0.5
    ref_out, _ = reference(q, k, v, cache, md, scale)
    out, _ = run_variant("avx512_bf16", q, k, v, nan_past_the_ends(cache, md), md, scale, allow_amx)
    assert not torch.isnan(out).any(), "unwritten or NaN output"
    assert rel_err(out, ref_out) < TOL[torch.bfloat16]


@pytest.mark.parametrize("group", [1, 4, 16])
def test_gqa_groups(group):
    check(VARIANTS[0], [(0, 9), (40, 1), (7, 20)], heads=2 * group, kv_heads=2, head_size=64, block_size=16,
          dtype=torch.bfloat16)


def test_head_size_32_fixture_size():
    check(VARIANTS[0], MIXED, heads=4, kv_heads=2, head_size=32, block_size=16, dtype=torch.float32)


@pytest.mark.parametrize("isa", sorted({cpu_isa.isa_of(v) for v in VARIANTS}))
def test_forced_isa_through_the_backend(isa, monkeypatch):
    """``OCTAVO_CPU_ISA`` picks the variant the backend's impl uses."""
    monkeypatch.setenv("OCTAVO_CPU_ISA", isa)
    cpu_isa.clear_cache()
    try:
        ext = cpu_isa.load_extension()
        assert cpu_isa.isa_of(ext.ISA) == isa
        q, k, v, cache, md = make_batch(MIXED, num_heads=8, num_kv_heads=2, head_size=128, block_size=16,
                                        dtype=torch.bfloat16, seed=3)
        scale = 128**-0.5
        ref_out, ref_cache = reference(q, k, v, cache, md, scale)
        impl = CpuPagedBackend.get_impl_cls()(8, 128, scale, 2)
        c = cache_from_reference(cache)
        out = impl.forward(q, k, v, c, CpuPagedBackend.build_metadata(md))
        assert torch.equal(cache_to_reference(c, 128).double(), ref_cache.to(torch.bfloat16).double())
        assert rel_err(out, ref_out) < TOL[torch.bfloat16]
    finally:
        monkeypatch.delenv("OCTAVO_CPU_ISA")
        cpu_isa.clear_cache()


def test_forcing_an_isa_the_cpu_lacks_is_refused(monkeypatch):
    foreign = "neon" if cpu_isa.machine() == "x86_64" else "avx2"
    with pytest.raises(ValueError, match=f"OCTAVO_CPU_ISA={foreign} but this CPU"):
        cpu_isa.select_variant(foreign)
    with pytest.raises(ValueError, match="is not one of"):
        cpu_isa.select_variant("sse9")
    # through the backend: an error naming the ISA, not a silent fall back to torch_ref
    monkeypatch.setenv("OCTAVO_CPU_ISA", foreign)
    cpu_isa.clear_cache()
    try:
        with pytest.raises(ValueError, match="lacks it"):
            CpuPagedBackend.validate(64, torch.bfloat16, "auto", 16, CpuPlatform)
    finally:
        monkeypatch.delenv("OCTAVO_CPU_ISA")
        cpu_isa.clear_cache()


def test_validate_reasons():
    ok = CpuPagedBackend.validate(128, torch.bfloat16, "auto", 16, CpuPlatform)
    assert ok == []
    reasons = CpuPagedBackend.validate(72, torch.bfloat16, "auto", 8, CpuPlatform)
    assert any("head size 72" in r for r in reasons)
    assert any("block size 8" in r for r in reasons)
    assert CpuPagedBackend.validate(64, torch.bfloat16, "fp8", 16, CpuPlatform)


def test_kv_cache_shape_and_repacking_round_trip():
    shape = CpuPagedBackend.get_kv_cache_shape(5, 16, 2, 64)
    assert shape == (5, 2, 2, 16 * 64)
    ref = torch.randn(2, 5, 16, 2, 64).to(torch.bfloat16)
    assert torch.equal(cache_to_reference(cache_from_reference(ref), 64), ref)


def test_padded_tokens_are_zero_and_slots_negative_skip():
    """Padding rows beyond num_actual_tokens come back zero; slot -1 writes nothing."""
    q, k, v, cache, md = make_batch([(3, 2)], num_heads=4, num_kv_heads=2, head_size=64, block_size=16,
                                    dtype=torch.float32)
    impl = CpuPagedBackend.get_impl_cls()(4, 64, 0.125, 2)
    c = cache_from_reference(cache)
    qp = torch.cat([q, torch.randn(3, 4, 64)])
    kp = torch.cat([k, torch.randn(3, 2, 64)])
    vp = torch.cat([v, torch.randn(3, 2, 64)])
    out = impl.forward(qp, kp, vp, c, CpuPagedBackend.build_metadata(md))
    assert out.shape == (5, 4, 64) and torch.count_nonzero(out[2:]) == 0
    ref_out, _ = reference(q, k, v, cache, md, 0.125)
    assert rel_err(out[:2], ref_out) < TOL[torch.float32]


@pytest.mark.usefixtures("cpu_platform")
def test_engine_greedy_tokens_match_torch_ref(llama_dir, monkeypatch):
    """The whole engine on cpu_paged generates the torch_ref tokens (float32, greedy)."""
    from octavo import LLM, SamplingParams

    prompts = ["def hello world", "the paged attention kernel of the engine", "data"]
    sp = SamplingParams(temperature=0.0, max_tokens=12)
    outs = {}
    for backend in ("cpu_paged", "torch_ref"):
        monkeypatch.setenv("OCTAVO_ATTENTION_BACKEND", backend)
        llm = LLM(model=llama_dir, dtype="float32", max_model_len=256, block_size=16)
        outs[backend] = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
        del llm
    assert outs["cpu_paged"] == outs["torch_ref"]


# -- the boundary: every tensor is checked before a kernel sees a pointer -------------------
def _boundary_case():
    q, k, v, ref_cache, md = make_batch([(3, 2), (0, 4)], num_heads=4, num_kv_heads=2, head_size=64,
                                        block_size=16, dtype=torch.float32)
    m = build_cpu_metadata(md)
    args = dict(query=q, out=torch.empty_like(q), kv_cache=cache_from_reference(ref_cache),
                query_start_loc=m.query_start_loc, seq_lens=m.seq_lens, block_table=m.block_table,
                scale=0.125)
    return cpu_isa.load_extension(), args, k, v, m


def test_bindings_take_named_tensors_only():
    ext, args, *_ = _boundary_case()
    ext.paged_attention(**args)  # the well-formed call runs
    with pytest.raises(TypeError):
        ext.paged_attention(*args.values())  # positional arguments are refused
    with pytest.raises(ValueError, match="query must be a torch tensor"):
        ext.paged_attention(**{**args, "query": args["query"].data_ptr()})


@pytest.mark.parametrize("change, message", [
    (lambda a: {"query": a["query"].to(torch.bfloat16)}, "out must have the dtype of query"),
    (lambda a: {"out": a["out"][:, :2]}, "out .* must be shaped like query"),
    (lambda a: {"kv_cache": a["kv_cache"][:, :1]}, "kv_cache .* must be contiguous"),
    (lambda a: {"query_start_loc": a["query_start_loc"].long()}, "query_start_loc .* must be int32"),
    (lambda a: {"seq_lens": a["seq_lens"][:1]}, "query_start_loc .* must hold len"),
    (lambda a: {"block_table": a["block_table"] + 1000}, "block_table .* names a block outside kv_cache"),
    (lambda a: {"query": a["query"].transpose(0, 1)}, "query .* packed heads"),
    (lambda a: {"kv_cache": a["kv_cache"][..., :100].contiguous()}, "kv_cache .* not a multiple of the head size"),
])
def test_attention_arguments_are_checked(change, message):
    ext, args, *_ = _boundary_case()
    with pytest.raises(ValueError, match=f"paged_attention: {message}"):
        ext.paged_attention(**{**args, **change(args)})


def test_write_kv_arguments_are_checked():
    ext, args, k, v, m = _boundary_case()
    cache, slots = args["kv_cache"], m.slot_mapping
    with pytest.raises(ValueError, match="write_kv: slot_mapping .* names a slot outside kv_cache"):
        ext.write_kv(key=k, value=v, kv_cache=cache, slot_mapping=slots + 10**6)
    with pytest.raises(ValueError, match="write_kv: slot_mapping .* more slots than key has tokens"):
        ext.write_kv(key=k[:2], value=v[:2], kv_cache=cache, slot_mapping=slots)
    with pytest.raises(ValueError, match="write_kv: value .* must be shaped like key"):
        ext.write_kv(key=k, value=v[:, :1], kv_cache=cache, slot_mapping=slots)
    with pytest.raises(ValueError, match="write_kv: slot_mapping .* must be int64"):
        ext.write_kv(key=k, value=v, kv_cache=cache, slot_mapping=slots.int())
