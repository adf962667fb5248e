"""Tensor-parallel layers; the loader hands each one the *full* checkpoint tensor and the layer
keeps only its rank's slice, so no rank ever holds the whole model.

Every parameter carries ``weight_loader(param, full_tensor, shard_id)``. With a world size of 1
each layer computes exactly what its plain ``nn`` counterpart computes (same ops, same order).

- ``ColumnParallelLinear``: output rows split across ranks; output stays sharded.
- ``QKVParallelLinear``: q/k/v fused, heads split; when ``tp > num_kv_heads`` each KV head is
  replicated on ``tp // num_kv_heads`` ranks.
- ``MergedColumnParallelLinear``: gate/up fused, each split.
- ``RowParallelLinear``: input columns split; partial outputs all-reduced (bias added once).
- ``VocabParallelEmbedding`` / ``ParallelLMHead``: vocabulary rows split (padded to a
  multiple of the world size); logits gathered on rank 0 and trimmed to the real vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from octavo.distributed.parallel_state import get_tp


def _default_loader(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"expected shape {tuple(param.shape)}, got {tuple(loaded.shape)}")
    param.data.copy_(loaded)


def _set_loader(param: nn.Parameter, loader) -> None:
    param.weight_loader = loader  # type: ignore[attr-defined]


class ColumnParallelLinear(nn.Module):
    """Output = concatenation of named shards; each shard's rows are split across ranks.

    ``shards`` maps a checkpoint shard id (``q``, ``gate``, or ``None`` for an unfused layer)
    to ``(local_rows, source_start)``: this rank keeps rows
    ``[source_start, source_start + local_rows)`` of that shard's full tensor.
    """

    def __init__(self, in_features: int, shards: dict[str | None, tuple[int, int]], bias: bool):
        super().__init__()
        self.shard_offsets: dict[str | None, tuple[int, int]] = {}
        self.shard_sources: dict[str | None, int] = {}
        off = 0
        for name, (rows, src) in shards.items():
            self.shard_offsets[name] = (off, rows)
            self.shard_sources[name] = src
            off += rows
        self.out_features = off
        self.weight = nn.Parameter(torch.empty(off, in_features))
        self.bias = nn.Parameter(torch.empty(off)) if bias else None
        for p in self.parameters(recurse=False):
            _set_loader(p, self._load)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
        off, rows = self.shard_offsets[shard_id]
        src = self.shard_sources[shard_id]
        piece = loaded.narrow(0, src, rows)
        target = param.data.narrow(0, off, rows)
        if target.shape != piece.shape:
            raise ValueError(
                f"shard {shard_id}: expected {tuple(target.shape)}, got {tuple(piece.shape)}"
            )
        target.copy_(piece)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


def _split(total: int, rank: int, world: int, what: str) -> tuple[int, int]:
    if total % world:
        raise ValueError(f"{what} ({total}) is not divisible by tensor_parallel_size ({world})")
    local = total // world
    return local, rank * local


class QKVParallelLinear(ColumnParallelLinear):
    def __init__(self, hidden: int, head_dim: int, num_heads: int, num_kv_heads: int, bias: bool):
        tp = get_tp()
        rank, world = tp.rank, tp.world_size
        heads, _ = _split(num_heads, rank, world, "num_attention_heads")
        if world <= num_kv_heads:
            kv_heads, _ = _split(num_kv_heads, rank, world, "num_key_value_heads")
            kv_start = rank * kv_heads
        else:  # replicate: several ranks share one KV head
            if world % num_kv_heads:
                raise ValueError(
                    f"tensor_parallel_size ({world}) must be a multiple of num_key_value_heads "
                    f"({num_kv_heads}) when it is larger"
                )
            kv_heads = 1
            kv_start = rank // (world // num_kv_heads)
        self.num_heads = heads
        self.num_kv_heads = kv_heads
        super().__init__(
            hidden,
            {
                "q": (heads * head_dim, rank * heads * head_dim),
                "k": (kv_heads * head_dim, kv_start * head_dim),
                "v": (kv_heads * head_dim, kv_start * head_dim),
            },
            bias,
        )


class MergedColumnParallelLinear(ColumnParallelLinear):
    def __init__(self, in_features: int, sizes: dict[str, int], bias: bool):
        tp = get_tp()
        shards = {}
        for name, size in sizes.items():
            shards[name] = _split(size, tp.rank, tp.world_size, name)
        super().__init__(in_features, shards, bias)


class RowParallelLinear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        tp = get_tp()
        self.tp = tp
        self.local_in, self.in_start = _split(in_features, tp.rank, tp.world_size, "input features")
        self.weight = nn.Parameter(torch.empty(out_features, self.local_in))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        _set_loader(self.weight, self._load_weight)
        if self.bias is not None:
            _set_loader(self.bias, _default_loader)

    def _load_weight(self, param, loaded, shard_id=None):
        _default_loader(param, loaded.narrow(1, self.in_start, self.local_in))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return F.linear(x, self.weight, self.bias)
        out = self.tp.all_reduce(F.linear(x, self.weight))
        return out if self.bias is None else out + self.bias


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int):
        super().__init__()
        tp = get_tp()
        self.tp = tp
        self.vocab_size = vocab_size
        padded = -(-vocab_size // tp.world_size) * tp.world_size
        self.local_vocab = padded // tp.world_size
        self.vocab_start = tp.rank * self.local_vocab
        self.weight = nn.Parameter(torch.empty(self.local_vocab, hidden))
        _set_loader(self.weight, self._load)

    def _load(self, param, loaded, shard_id=None):
        if loaded.shape[0] != self.vocab_size:
            raise ValueError(f"expected {self.vocab_size} vocabulary rows, got {loaded.shape[0]}")
        rows = max(0, min(self.local_vocab, self.vocab_size - self.vocab_start))
        param.data.zero_()
        if rows:
            param.data[:rows].copy_(loaded.narrow(0, self.vocab_start, rows))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.world_size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.vocab_start
        mask = (local < 0) | (local >= self.local_vocab)
        out = F.embedding(local.masked_fill(mask, 0), self.weight)
        out.masked_fill_(mask.unsqueeze(-1), 0)
        return self.tp.all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Vocabulary-parallel output projection; may share its weight with the embedding."""

    def compute_logits(self, hidden: torch.Tensor, weight: torch.Tensor | None = None) -> torch.Tensor | None:
        """Full logits on rank 0 (``None`` on other ranks)."""
        w = self.weight if weight is None else weight
        local = F.linear(hidden, w)
        if self.tp.world_size == 1:
            return local
        full = self.tp.gather(local, dst=0, dim=-1)
        return None if full is None else full[..., : self.vocab_size]
