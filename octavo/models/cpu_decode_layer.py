"""A Llama-family decoder layer's step on the CPU without the module tree in between.

At decode sizes a layer's kernels (RMSNorm, QKV, RoPE, KV write + attention, O, RMSNorm,
gate/up, SiLU·mul, down: all C++ on the CPU) take ~0.4 ms for SmolLM2-135M, and the Python
between them took another ~0.1 ms per layer: seven ``nn.Module`` calls, each op's "may I use
the fused kernel" checks, the linear dispatch chain, a wrapper per kernel. Measured on a 2-core
Xeon, 2 threads, batch 1: that Python was ~3 ms of an 18 ms step (more than its own run time
suggests: the interpreter runs with caches the kernels just flushed).

``LeanLlamaLayer`` calls the same C++ kernels with the same arguments in the same order as the
module path (``cpu_fused_ops``' wrappers, the quantized layers' kernels, the attention's
``write_kv_and_attend``), so its output is the module path's bit for bit (tested). It resolves
once per layer what the module path re-derives on every call: the submodules, which linears
run the bf16 GEMV (with its packed weight, remade if the weight is replaced or modified in
place). It runs where the fused kernels' per-call conditions hold (bf16 or fp16 activations,
no autograd, not tracing; activations and norm weights contiguous) and the layer has nothing
it does not reproduce (checked once: classes marked ``lean_cpu_step``, one tensor-parallel
rank, RoPE over the whole head without length-dependent tables, the CPU paged attention);
otherwise the module path runs.

Where every linear of the layer runs the bf16 GEMV or the C++ INT8 / INT4 weight-only kernels
(``cpu_int.int_linear``: ``int_linear``, or ``int_linear_a8`` for int8 activations) at the
step's row count (decode batches; up to 64 rows on AMX) and the layer has no q/k norms, the
whole step is one extension call, ``decoder_layer`` (``FusedLinear`` says how each linear
runs): the same kernels with the same arguments in the same order, intermediates in a C++
scratch buffer, so the output is still bit for bit the module path's (tested). The
per-op Python it replaces (ten kernel calls, a dozen allocations, splits and views per layer)
was ~5 ms of a 45 ms step at 48 rows (SmolLM2-135M, 2-core Xeon, 2 threads).
"""

from __future__ import annotations

from types import ModuleType
from typing import NamedTuple

import torch
from torch import nn

from octavo.attention.backend import KVGroupMetadata
from octavo.attention.backends.cpu_paged import (
    CpuPagedMetadata,
    build_cpu_metadata,
    write_kv_and_attend,
)
from octavo.models.linear_dispatch import linear

ENABLED = True  # False: every layer takes the module path (comparisons, tests)
FUSED = True  # False: the lean path calls each kernel from Python (read when a layer is attached)


def _single_rank(module: nn.Module) -> bool:
    tp = module.__dict__.get("tp")
    return tp is None or tp.world_size == 1


def _reproduced(module: nn.Module) -> bool:
    """The module's own class (not a subclass) says this path reproduces its forward."""
    return bool(type(module).__dict__.get("lean_cpu_step"))


def _why_not(layer: nn.Module) -> str | None:
    """Why ``layer`` must keep the module path (None: the lean path applies)."""
    from octavo.attention.backends.cpu_paged import CpuPagedImpl

    attn, mlp = layer.self_attn, layer.mlp
    if not (_reproduced(layer) and _reproduced(attn) and _reproduced(mlp)):
        return "not the standard decoder layer, attention and MLP"
    if type(attn.attn.impl) is not CpuPagedImpl:
        return "attention is not the CPU paged kernel"
    linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
    if not all(_single_rank(m) for m in linears):
        return "tensor parallel"
    rope = attn.rotary_emb
    if rope.inv_freq_by_len is not None or rope.cos.shape[-1] != attn.head_dim:
        return "RoPE tables depend on the length or rotate part of the head"
    return None


class FusedLinear(NamedTuple):
    """How the fused step runs one linear: ``decoder_layer``'s ``*_weight`` and ``*_bias``.

    bf16 (``quantized`` False): ``weight`` is the GEMV's packed copy of the weight parameter
    ``source`` made at its ``version``, ``bias`` the module's own. Quantized: ``weight`` is the
    layer's ``cpu_int.PackedInt`` (``source``, the same object), ``bias`` the float32 copy
    ``int_linear`` would add, made from ``bias_source`` at ``bias_version``. Invariant: the
    plan is stale (remade) once a source was replaced or, where a version is kept, modified
    in place."""

    source: object
    version: int | None
    weight: object
    bias: torch.Tensor | None
    bias_source: torch.Tensor | None
    bias_version: int | None
    k: int  # input features
    quantized: bool

    def rows_ok(self, cfo: ModuleType, rows: int) -> bool:
        """Whether the per-op path runs ``rows`` bf16 rows in this plan's kernel."""
        if self.quantized:
            from octavo.quantization.kernels import cpu_int

            return cpu_int.runs_in_kernel(self.weight, rows, torch.bfloat16)
        return cfo.gemv_rows(rows, self.k)

    def rows_key(self) -> tuple:
        """Plans with equal keys agree on ``rows_ok`` for every row count."""
        w = self.weight
        return ("int", w.a8, w.amx, w.dpbf16) if self.quantized else ("gemv", self.k)

    def stale(self, module: nn.Module) -> bool:
        params = module._parameters
        src = module.__dict__["quant_state"].packed if self.quantized else params["weight"]
        if src is not self.source or (self.version is not None and src._version != self.version):
            return True
        b = params.get("bias")
        return b is not self.bias_source or (self.bias_version is not None and b._version != self.bias_version)


def _int_plan(cfo: ModuleType, module: nn.Module, state) -> FusedLinear | None:
    """The plan of a quantized linear whose per-op path is ``cpu_int.int_linear`` with this
    extension's kernels (one rank, no input permutation), else None."""
    kernel, packed = state.kernel, state.packed
    if kernel is None or not kernel.cpu_int_linear or state.perm is not None:
        return None
    from octavo.quantization.kernels import cpu_int

    if not isinstance(packed, cpu_int.PackedInt) or packed.ext is not cfo._ext:
        return None
    b = module._parameters.get("bias")
    return FusedLinear(packed, None, packed, cpu_int.kernel_bias(b), b, None if b is None else b._version,
                       packed.k, True)


def _fused_linear(cfo: ModuleType, module: nn.Module) -> FusedLinear | None:
    """How the fused step runs ``module`` where the module path runs it through the bf16 GEMV
    at decode sizes (the checks of ``cpu_fused_ops.linear``) or the C++ INT8 / INT4 kernels
    (``_int_plan``); None: the per-op path must run it."""
    d = module.__dict__
    state = d.get("quant_state")
    if state is not None:
        return _int_plan(cfo, module, state)
    w = d["_parameters"].get("weight")
    if w is None or not cfo.linear_usable(module, w):
        return None
    b = d["_parameters"].get("bias")
    if b is not None and b.dtype is not torch.bfloat16:
        return None
    packed = cfo.gemv_packed(module, w, torch.bfloat16)
    return None if packed is None else FusedLinear(w, w._version, packed, b, b, None, w.shape[1], False)


def step_inputs(attn_metadata, group, positions: torch.Tensor) -> tuple[CpuPagedMetadata, torch.Tensor]:
    """The CPU kernels' view of a step: the metadata of KV cache group ``group`` as
    ``CpuPagedMetadata``, positions as contiguous int64."""
    md = attn_metadata
    if md.__class__ is KVGroupMetadata:
        md = md.groups[group]
    if md.__class__ is not CpuPagedMetadata:
        md = build_cpu_metadata(md)
    if positions.dtype is not torch.int64 or not positions.is_contiguous():
        positions = positions.to(torch.int64).contiguous()
    return md, positions


class LeanLlamaLayer:
    """``LlamaDecoderLayer.forward`` for the CPU (see the module docstring); ``__call__``
    returns None where the module path must run.

    Parameters are read from the modules on every call; the packed GEMV copy of a linear's
    weight is remade when that weight was replaced or modified in place."""

    _UNSET = object()

    def __init__(self, layer: nn.Module, cfo: ModuleType) -> None:
        self.layer, self.cfo, self.ext = layer, cfo, cfo._ext
        self.why_not = _why_not(layer)
        if self.why_not is not None:
            return
        attn, mlp = layer.self_attn, layer.mlp
        # the module tree is fixed: submodules resolved once
        self.norm1, self.norm2 = layer.input_layernorm, layer.post_attention_layernorm
        self.qk_norm = (attn.q_norm, attn.k_norm) if attn.qk_norm else None
        self.linears = (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj)
        self.plans: list = [self._UNSET] * 4  # FusedLinear or None per linear, made on first use
        self.rope, self.attn_layer = attn.rotary_emb, attn.attn
        self.split = [attn.q_size, attn.kv_size, attn.kv_size]
        self.heads = (attn.num_heads, attn.num_kv_heads, attn.head_dim, attn.q_size)
        # the fused step (one ``decoder_layer`` call) applies: no q/k norms, the extension has it
        self.fused = FUSED and self.qk_norm is None and hasattr(self.ext, "decoder_layer")

    def __call__(self, positions, hidden, residual, attn_metadata):
        cfo, ext = self.cfo, self.ext
        if (
            self.why_not is not None
            or not (ENABLED and cfo.usable(hidden))
            or hidden.dim() != 2
            or not hidden.is_contiguous()
        ):
            return None
        w1, w2 = self.norm1._parameters["weight"], self.norm2._parameters["weight"]
        if not (w1.is_contiguous() and w2.is_contiguous()) or (
            residual is not None and not residual.is_contiguous()
        ):
            return None  # the C++ kernels read them as they are; the module path copies
        t, dim, dt = hidden.shape[0], hidden.shape[1], hidden.dtype
        fused = self._fused_step(positions, hidden, residual, attn_metadata, w1, w2)
        if fused is not None:
            return fused
        x = torch.empty((t, dim), dtype=dt)
        if residual is None:
            ext.rms_norm(x=hidden, weight=w1, out=x, eps=self.norm1.eps)
            residual = hidden
        else:
            r = torch.empty((t, dim), dtype=dt)
            ext.rms_norm(
                x=hidden, weight=w1, out=x, eps=self.norm1.eps, residual=residual, residual_out=r
            )
            residual = r
        a = self._attention(positions, x, attn_metadata)
        x = torch.empty((t, dim), dtype=dt)
        r = torch.empty((t, dim), dtype=dt)
        ext.rms_norm(x=a, weight=w2, out=x, eps=self.norm2.eps, residual=residual, residual_out=r)
        gate_up = self._linear(2, x)
        h = torch.empty((t, gate_up.shape[1] // 2), dtype=dt)
        ext.silu_and_mul(x=gate_up, out=h)
        return self._linear(3, h), r

    def _plan(self, i: int) -> FusedLinear | None:
        """How the fused step runs linear ``i`` (None: it cannot); remade when stale."""
        g = self.plans[i]
        if g is self._UNSET or (g is not None and g.stale(self.linears[i])):
            g = self.plans[i] = _fused_linear(self.cfo, self.linears[i])
        return g

    def _linear(self, i: int, x: torch.Tensor) -> torch.Tensor:
        module, ext = self.linears[i], self.ext
        if x.dtype is torch.bfloat16 and self.cfo.gemv_rows(x.shape[0], x.shape[1]):
            g = self._plan(i)
            if g is not None and not g.quantized:
                out = torch.empty((x.shape[0], g.weight.shape[0] * 16), dtype=x.dtype)
                ext.gemv(x=x, weight=g.weight, out=out, bias=g.bias)
                return out
        return linear(module, x)  # the module path's own dispatch (quantized, prepacked, module)

    def _fused_step(self, positions, hidden, residual, attn_metadata, w1, w2):
        """The whole step in one extension call (``decoder_layer``: the kernels below with the
        same arguments in the same order) where every linear runs the bf16 GEMV or the C++
        INT8 / INT4 kernel at this row count and the layer has no q/k norms; else None (the
        per-op path runs)."""
        t = hidden.shape[0]
        if not (self.fused and hidden.dtype is torch.bfloat16 and self.cfo.gemv_rows(t, 32)):
            return None
        plans = [self._plan(i) for i in range(4)]
        if any(g is None or not g.rows_ok(self.cfo, t) for g in plans):
            return None
        layer = self.attn_layer
        md, positions = step_inputs(attn_metadata, layer.kv_group, positions)
        nh, nkv, _, _ = self.heads
        tables, impl = self.rope._buffers, layer.impl
        out, res = torch.empty_like(hidden), torch.empty_like(hidden)
        self.ext.decoder_layer(
            hidden=hidden, residual=residual, hidden_out=out, residual_out=res, norm1=w1, norm2=w2,
            eps1=self.norm1.eps, eps2=self.norm2.eps, qkv_weight=plans[0].weight, qkv_bias=plans[0].bias,
            o_weight=plans[1].weight, o_bias=plans[1].bias, gate_up_weight=plans[2].weight,
            gate_up_bias=plans[2].bias, down_weight=plans[3].weight, down_bias=plans[3].bias,
            positions=positions, cos=tables["cos"], sin=tables["sin"], num_heads=nh, num_kv_heads=nkv,
            kv_cache=layer.kv_cache, slot_mapping=md.slot_mapping[: md.num_actual_tokens],
            query_start_loc=md.query_start_loc, seq_lens=md.seq_lens, block_table=md.block_table,
            scale=impl.scale, sliding_window=impl._window, soft_cap=impl._soft_cap,
        )
        return out, res

    def _attention(self, positions, x, attn_metadata):
        cfo, ext = self.cfo, self.ext
        qkv = self._linear(0, x)
        t, dt = qkv.shape[0], qkv.dtype
        nh, nkv, hd, q_size = self.heads
        q, k, v = qkv.split(self.split, dim=-1)
        q = q.view(t, nh, hd)
        k = k.view(t, nkv, hd)
        v = v.view(t, nkv, hd)
        if self.qk_norm is not None:  # Qwen3's per-head norms (the wrapper: q, k are strided views)
            qn, kn = self.qk_norm
            q = cfo.rms_norm(q, qn._parameters["weight"], qn.eps)
            k = cfo.rms_norm(k, kn._parameters["weight"], kn.eps)
        if positions.dtype is not torch.int64 or not positions.is_contiguous():
            positions = positions.to(torch.int64).contiguous()
        q_rot = torch.empty((t, nh, hd), dtype=dt)
        k_rot = torch.empty((t, nkv, hd), dtype=dt)
        tables = self.rope._buffers
        ext.rope(positions=positions, q=q, k=k, cos=tables["cos"], sin=tables["sin"], q_out=q_rot, k_out=k_rot)
        layer = self.attn_layer
        md = attn_metadata
        if md.__class__ is KVGroupMetadata:
            md = md.groups[layer.kv_group]
        if md.__class__ is not CpuPagedMetadata:
            md = build_cpu_metadata(md)
        impl = layer.impl
        out = write_kv_and_attend(
            impl._ext, q_rot, k_rot, v, layer.kv_cache, md.slot_mapping[: md.num_actual_tokens],
            md.query_start_loc, md.seq_lens, md.block_table, impl.scale, impl._window, impl._soft_cap,
        )
        return self._linear(1, out.view(t, q_size))


def attach(model: nn.Module, cfo: ModuleType) -> int:
    """Give every decoder layer of ``model`` whose class is marked ``lean_cpu_step`` its lean
    path over the CPU's fused kernels ``cfo``; returns how many can take it (the others keep
    the reason in ``why_not``)."""
    n = 0
    for m in model.modules():
        if _reproduced(m) and hasattr(m, "self_attn") and hasattr(m, "mlp"):
            lean = LeanLlamaLayer(m, cfo)
            m.__dict__["lean_forward"] = lean
            n += lean.why_not is None
    return n
