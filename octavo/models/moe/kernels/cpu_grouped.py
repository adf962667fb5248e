"""CPU experts: token-expert pairs sorted by expert, one GEMM pair per active expert.

The pairs are sorted once (``argsort``), the tokens gathered in that order, and each expert
with work runs ``[n_e, H] x [H, 2I]`` then ``[n_e, I] x [I, H]`` on its contiguous segment; the
weighted results are summed back per token with one ``index_add_``. The Python loop is over
experts (at most E per layer), never over tokens.

Compute dtype: bfloat16 weights are multiplied in bfloat16 on CPUs with AVX-512 (oneDNN's
bf16 GEMMs); elsewhere each active expert's weights are widened to float32 for its GEMMs,
because bf16 GEMMs without AVX-512 are emulated and slower than fp32. float32 runs float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from octavo.models.moe.kernels.base import ExpertsKernel


def _has_avx512() -> bool:
    from octavo.cpu_isa import best_isa

    return best_isa()[0] == "avx512"


class CpuGroupedExperts(ExpertsKernel):
    name = "cpu_grouped"
    supported_device_types = ("cpu",)

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__(dtype)
        low = dtype in (torch.bfloat16, torch.float16)
        native = dtype == torch.bfloat16 and _has_avx512()
        self.compute_dtype = torch.float32 if low and not native else dtype

    def describe(self) -> str:
        return f"{self.name} (GEMMs in {str(self.compute_dtype).removeprefix('torch.')})"

    def apply(self, x, w13, w2, weights, ids):
        num_tokens, top_k = ids.shape
        num_experts, two_inter, _ = w13.shape
        inter = two_inter // 2
        flat = ids.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=num_experts + 1).tolist()
        token_of = order // top_k
        xs = x.index_select(0, token_of).to(self.compute_dtype)
        ys = torch.empty_like(xs)
        start = 0
        for e in range(num_experts):
            n = counts[e]
            if n == 0:
                continue
            seg = xs[start:start + n]
            gate_up = F.linear(seg, w13[e].to(self.compute_dtype))
            h = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
            ys[start:start + n] = F.linear(h, w2[e].to(self.compute_dtype))
            start += n
        used = start  # pairs past `used` belong to experts of other ranks
        scaled = ys[:used] * weights.reshape(-1)[order[:used], None]
        out = torch.zeros(num_tokens, x.shape[1], dtype=scaled.dtype, device=x.device)
        out.index_add_(0, token_of[:used], scaled)
        return out.to(x.dtype)
