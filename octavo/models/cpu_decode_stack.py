"""A Llama-family model's whole decoder stack in one extension call on the CPU.

``cpu_decode_layer`` runs a layer's decode step in one ``decoder_layer`` call; between two
such calls the model's layer loop still ran ~80 µs of Python per layer (SmolLM2-135M, 48 rows,
2-core Xeon: 2.3 ms of a 40 ms step, about seven times what the same code takes with warm
caches: it runs right after a kernel streamed megabytes of weights and KV through them).
``LeanStack`` replaces ``LlamaModel.forward``'s loop by one ``DecoderStack.run``: the same
per-layer kernels with the same arguments in the same order (bit for bit the layer-by-layer
output, tested), the step's tensors checked once for all layers.

The C++ plan (``DecoderStack``) holds every layer's weights, norms, RoPE tables and KV cache,
checked once. Each step first checks that none of them was replaced or modified in place
(identity and version counter, ~400 reads for 30 layers) and rebuilds the plan if one was
(so a weight update is seen, as on the per-layer path). Layer constants that are plain numbers
(eps, the attention scale, window, soft cap) are read when the plan is built. It applies where
every layer takes the fused step (``LeanLlamaLayer.fused``, every linear on the bf16 GEMV or
the C++ INT8 / INT4 kernels at this row count: ``FusedLinear``), the model keeps no auxiliary
hidden states (EAGLE-3) and all layers share one KV cache group; otherwise the layers run one
by one.
"""

from __future__ import annotations

import torch
from torch import nn

from octavo.models import cpu_decode_layer
from octavo.models.cpu_decode_layer import FusedLinear, LeanLlamaLayer

ENABLED = True  # False: the layers are called one by one (comparisons, tests)


def _watch(lean: LeanLlamaLayer) -> list[tuple[dict, str, object, int | None]]:
    """(container, key, object, version) of everything a layer's plan points into. Versions
    only where the plan reads a copy (a bf16 weight's packed GEMV copy, a quantized layer's
    float32 bias); the rest it reads in place, so only their replacement matters."""
    out = [(lean.norm1._parameters, "weight", False), (lean.norm2._parameters, "weight", False)]
    for m in lean.linears:
        state = m.__dict__.get("quant_state")
        if state is None:
            out += [(m._parameters, "weight", True), (m._parameters, "bias", False)]
        else:
            out += [(state.__dict__, "packed", False), (m._parameters, "bias", True)]
    out += [(lean.attn_layer.__dict__, "kv_cache", False), (lean.rope._buffers, "cos", False),
            (lean.rope._buffers, "sin", False)]
    return [(d, k, d.get(k), d[k]._version if versioned and d.get(k) is not None else None) for d, k, versioned in out]


class LeanStack:
    """``LlamaModel.forward``'s layer loop for the CPU (see the module docstring); ``__call__``
    returns (hidden, residual) after the last layer, or None where the layers must run one by
    one. Invariant: ``plan`` points into exactly the tensors recorded in ``watch``, at the
    versions recorded there (None: no plan applies to them)."""

    def __init__(self, lean: list[LeanLlamaLayer]) -> None:
        self.lean = lean
        self.cfo = lean[0].cfo
        self.plan = None
        self.watch: list[tuple[dict, str, object, int]] = []
        self.row_checks: list[FusedLinear] = []  # one linear per distinct row rule (``rows_ok``)
        self.group = None  # the KV cache group every layer reads

    def _changed(self) -> bool:
        return not self.watch or any(
            d.get(k) is not o or (v is not None and o._version != v) for d, k, o, v in self.watch
        )

    def _build(self) -> None:
        """A plan over the layers' current tensors, or None where a layer cannot take it."""
        self.watch = [w for lean in self.lean for w in _watch(lean)]
        self.plan = None
        groups = {lean.attn_layer.kv_group for lean in self.lean}
        if len(groups) != 1 or not all(lean.fused and lean.why_not is None for lean in self.lean):
            return
        layers, rules = [], {}
        for lean in self.lean:
            plans = [lean._plan(i) for i in range(4)]
            if any(g is None for g in plans):
                return
            layers.append(_layer_args(lean, plans))
            rules.update((g.rows_key(), g) for g in plans)
        first = self.lean[0]
        nh, nkv, _, _ = first.heads
        self.plan = self.cfo._ext.DecoderStack(layers=layers, hidden_size=first.norm1._parameters["weight"].shape[0],
                                               num_heads=nh, num_kv_heads=nkv)
        self.row_checks = list(rules.values())
        self.group = groups.pop()

    def __call__(self, positions: torch.Tensor, hidden: torch.Tensor, attn_metadata) -> tuple | None:
        cfo = self.cfo
        if not (ENABLED and cpu_decode_layer.ENABLED and hidden.dtype is torch.bfloat16 and cfo.usable(hidden)):
            return None
        t = hidden.shape[0]
        if hidden.dim() != 2 or not hidden.is_contiguous() or not cfo.gemv_rows(t, 32):
            return None
        if self._changed():
            self._build()
        if self.plan is None or not all(g.rows_ok(cfo, t) for g in self.row_checks):
            return None
        md, positions = cpu_decode_layer.step_inputs(attn_metadata, self.group, positions)
        out, res = torch.empty_like(hidden), torch.empty_like(hidden)
        self.plan.run(
            hidden=hidden, hidden_out=out, residual_out=res, positions=positions,
            slot_mapping=md.slot_mapping[: md.num_actual_tokens], query_start_loc=md.query_start_loc,
            seq_lens=md.seq_lens, block_table=md.block_table,
        )
        return out, res


def _layer_args(lean: LeanLlamaLayer, plans: list[FusedLinear]) -> dict:
    """A layer's constants as ``DecoderStack`` takes them (``decoder_layer``'s keywords)."""
    impl, tables = lean.attn_layer.impl, lean.rope._buffers
    linears = {name: g for name, g in zip(("qkv", "o", "gate_up", "down"), plans, strict=True)}
    return dict(
        norm1=lean.norm1._parameters["weight"], norm2=lean.norm2._parameters["weight"], eps1=lean.norm1.eps,
        eps2=lean.norm2.eps, cos=tables["cos"], sin=tables["sin"], kv_cache=lean.attn_layer.kv_cache,
        scale=impl.scale, sliding_window=impl._window, soft_cap=impl._soft_cap,
        **{f"{n}_weight": g.weight for n, g in linears.items()}, **{f"{n}_bias": g.bias for n, g in linears.items()},
    )


def attach(model: nn.Module) -> int:
    """Give every module of ``model`` whose class is marked ``lean_cpu_stack`` (its ``layers``
    are decoder layers with a lean step) a ``lean_stack``; returns how many got one."""
    n = 0
    for m in model.modules():
        if not type(m).__dict__.get("lean_cpu_stack"):
            continue
        lean = [layer.__dict__.get("lean_forward") for layer in m.layers]
        if lean and all(isinstance(x, LeanLlamaLayer) and x.why_not is None and x.fused for x in lean):
            m.__dict__["lean_stack"] = LeanStack(lean)
            n += 1
    return n
