"""Group token-expert pairs by expert, each expert's segment padded to a multiple of a block.

A batch of ``T`` tokens with ``k`` experts each has ``N = T * k`` (token, expert) pairs; pair
``p`` is token ``p // k``'s ``p % k``-th choice. ``align_block_size`` returns

- ``sorted_pair_ids`` [``N + E * (block - 1)``] (a static upper bound): pair ids grouped by
  expert (ascending), each expert's run padded to a multiple of ``block`` with the sentinel
  ``N``; slots after the last used block also hold ``N``;
- ``block_expert_ids`` [``len(sorted_pair_ids) // block``]: the expert of every block, or -1
  for blocks of the dropped bucket (see below) and blocks past the end;
- ``num_padded`` [1]: the number of used slots (a multiple of ``block``).

Ids equal to ``num_experts`` mark pairs this rank does not compute (an expert held by another
rank under expert parallelism); they form their own bucket whose blocks get expert id -1.

Every step is a fixed-shape torch op (no host synchronisation), so it runs inside captured
device graphs and on any device.
"""

from __future__ import annotations

import torch


def align_block_size(
    expert_ids: torch.Tensor, num_experts: int, block: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``expert_ids`` [T, k] (values in ``[0, num_experts]``) -> (sorted_pair_ids,
    block_expert_ids, num_padded), all int32 on the same device."""
    dev = expert_ids.device
    flat = expert_ids.reshape(-1).to(torch.int64)
    n = flat.numel()
    buckets = num_experts + 1  # the last bucket holds pairs no local expert computes
    counts = torch.zeros(buckets, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, flat, torch.ones_like(flat))
    padded = (counts + block - 1) // block * block
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    sorted_experts = flat[order]
    first_of_expert = torch.cumsum(counts, 0) - counts
    rank_in_expert = torch.arange(n, device=dev) - first_of_expert[sorted_experts]
    dest = starts[sorted_experts] + rank_in_expert
    capacity = n + buckets * (block - 1)
    capacity = (capacity + block - 1) // block * block
    sorted_ids = torch.full((capacity,), n, dtype=torch.int32, device=dev)
    sorted_ids[dest] = order.to(torch.int32)
    block_starts = torch.arange(0, capacity, block, device=dev)
    block_experts = torch.searchsorted(ends, block_starts, right=True)
    block_experts = torch.where(block_experts >= num_experts, -1, block_experts).to(torch.int32)
    return sorted_ids, block_experts, ends[-1:].to(torch.int32)
