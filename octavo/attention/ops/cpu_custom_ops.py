"""octavo's C++ paged attention as a ``torch.library`` custom op, so ``torch.compile`` keeps it in
its graph (the CPU graph mode, ``octavo/worker/cpu_graph.py``).

Dynamo cannot trace into a pybind11 function: called directly, each one would break the graph.
As custom ops with fake (meta) implementations they are opaque nodes inductor schedules around,
and the compiled step stays one graph. Eager steps keep calling the extension directly (a custom
op's Python dispatch costs a few microseconds per call); the layers switch on
``torch.compiler.is_compiling()``, which is a constant while dynamo traces.

- ``octavo::cpu_paged_attention``: write the step's K/V at the slot mapping, then causal paged
  attention of the query over the cache (one op: the write must precede the read). It mutates
  ``kv_cache`` in place (declared, so inductor neither reorders nor copies around it).
The bf16 decode GEMV is ``octavo::cpu_gemv`` in ``octavo/models/cpu_fused_ops.py``.

Registered once, when this module is first imported (the CPU graph mode imports it).
"""

from __future__ import annotations

import torch

from octavo.attention.backends.cpu_paged import write_kv_and_attend
from octavo.cpu_isa import load_extension

_ext = load_extension()


@torch.library.custom_op("octavo::cpu_paged_attention", mutates_args=("kv_cache",))
def cpu_paged_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
    slot_mapping: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
    block_table: torch.Tensor, scale: float, sliding_window: int, soft_cap: float,
) -> torch.Tensor:
    """``[T, H, D]`` attention output in the cache dtype; every query token is a real token
    (``len(slot_mapping) == T``: the graph mode compiles unpadded steps only)."""
    return write_kv_and_attend(_ext, query, key, value, kv_cache, slot_mapping, query_start_loc, seq_lens,
                               block_table, scale, sliding_window, soft_cap)


@cpu_paged_attention.register_fake
def _(query, key, value, kv_cache, slot_mapping, query_start_loc, seq_lens, block_table, scale,
      sliding_window, soft_cap):
    return query.new_empty(query.shape, dtype=kv_cache.dtype).contiguous()

