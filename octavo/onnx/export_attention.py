"""Attention over explicit past K/V tensors: the kernel octavo's decoders run while exported.

The exported graph's inputs are ``input_ids`` [B, S], ``attention_mask`` [B, P + S] (1 = a real
token, 0 = padding) and ``position_ids`` [B, S], with ``past_key_values.{i}.key/value``
[B, num_kv_heads, P, head_size] per layer; each layer returns ``present.{i}.key/value`` =
past ++ new along the sequence axis (the layout of ONNX Runtime GenAI and transformers.js).

Masking is by position, so padding may sit anywhere: a key's position is the number of real
tokens up to it minus one (``cumsum(attention_mask) - 1``, how transformers derives position
ids), and query ``j`` of row ``b`` (at ``position_ids[b, j]``) sees the real keys at positions
``<=`` its own, and within ``sliding_window`` of it for windowed layers. The computation
follows transformers' eager attention (scale, soft cap, additive mask, float32 softmax).
"""

from __future__ import annotations

from typing import Any

import torch

from octavo.attention.backend import AttentionBackend, AttentionImpl


class ExportStep:
    """Per-forward state of an export trace: the past tensors in, the present tensors out."""

    def __init__(
        self, attention_mask: torch.Tensor, position_ids: torch.Tensor, past: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> None:
        self.past = past
        self.presents: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.batch = position_ids.shape[0]
        key_pos = attention_mask.cumsum(-1) - 1  # [B, K]
        real = attention_mask[:, None, :] > 0  # [B, 1, K]
        self._dist = position_ids[:, :, None] - key_pos[:, None, :]  # [B, S, K]: query pos - key pos
        self._causal = real & (self._dist >= 0)
        self._masks: dict[Any, torch.Tensor] = {}

    def additive_mask(self, sliding_window: int | None, dtype: torch.dtype) -> torch.Tensor:
        """[B, 1, S, K]: 0 where a query may attend, the dtype's lowest value elsewhere."""
        key = (sliding_window, dtype)
        if key not in self._masks:
            allowed = self._causal if sliding_window is None else self._causal & (self._dist < sliding_window)
            zero = torch.zeros((), dtype=dtype)
            low = torch.tensor(torch.finfo(dtype).min, dtype=dtype)
            self._masks[key] = torch.where(allowed, zero, low)[:, None]
        return self._masks[key]


class ExportAttentionImpl(AttentionImpl):
    supports_sliding_window = True
    supports_logits_soft_cap = True

    def forward(self, query, key, value, kv_cache, attn_metadata: ExportStep) -> torch.Tensor:
        """``query`` [B*S, H, D], ``key``/``value`` [B*S, Hk, D] -> [B*S, H, D]."""
        step = attn_metadata
        past_k, past_v = step.past[len(step.presents)]
        b, h, hk, d = step.batch, self.num_heads, self.num_kv_heads, self.head_size
        q = query.reshape(b, -1, h, d).transpose(1, 2)
        k = torch.cat([past_k, key.reshape(b, -1, hk, d).transpose(1, 2)], dim=2)
        v = torch.cat([past_v, value.reshape(b, -1, hk, d).transpose(1, 2)], dim=2)
        step.presents.append((k, v))
        if hk != h:  # grouped-query attention: each KV head serves h // hk query heads
            k = k[:, :, None].expand(-1, -1, h // hk, -1, -1).reshape(b, h, -1, d)
            v = v[:, :, None].expand(-1, -1, h // hk, -1, -1).reshape(b, h, -1, d)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.scale
        if self.logits_soft_cap is not None:
            scores = torch.tanh(scores / self.logits_soft_cap) * self.logits_soft_cap
        scores = scores + step.additive_mask(self.sliding_window, scores.dtype)
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v)  # [B, H, S, D]
        return out.transpose(1, 2).reshape(-1, h, d)


class ExportAttentionBackend(AttentionBackend):
    """Not a serving backend: octavo's decoders are built with it only to be exported."""

    name = "onnx_export"

    @classmethod
    def get_impl_cls(cls) -> type[AttentionImpl]:
        return ExportAttentionImpl
