"""Building blocks of Llama-family decoders, numerically matched to HF transformers.

Each op follows transformers' order of operations and dtypes exactly, so float32 outputs agree
bit for bit wherever the underlying GEMMs do.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from octavo.models.length_rope import length_rope
from octavo.models.length_rope import rope_parameters_of as _rope_parameters
from octavo.models.linear_dispatch import fused_ops_of, linear  # noqa: F401  (models import them from here)

FUSED_OPS_MODULES = {"triton": "octavo.models.fused_ops", "cpu": "octavo.models.cpu_fused_ops"}

logger = logging.getLogger(__name__)


def load_fused_ops(kind: str) -> ModuleType | None:
    """The fused-kernel module of ``Platform.fused_op_kernels`` (None for "none", or when its
    kernels are not importable here: triton missing, the C++ extension not built)."""
    if kind == "none":
        return None
    if kind not in FUSED_OPS_MODULES:
        raise ValueError(f"unknown fused op kernels {kind!r}; known: none, {', '.join(FUSED_OPS_MODULES)}")
    try:
        return importlib.import_module(FUSED_OPS_MODULES[kind])
    except ImportError as e:
        logger.info("fused %s kernels unavailable (%s); layers run eager torch", kind, e)
        return None


def bind_fused_ops(model: nn.Module, kind: str, decode_gemv: str = "off") -> ModuleType | None:
    """Choose the fused kernels once, when a model is loaded: every submodule gets ``fused_ops``.

    Layers never inspect a tensor's device; a module that was never bound runs eager torch.
    Each call still asks ``ops.usable(x)`` for what varies per call (dtype, autograd).
    ``decode_gemv`` (the platform's ``decode_gemv_policy()``): where the kernels have a
    small-batch GEMV, it picks GEMV or BLAS per linear weight shape now, with the weights loaded.
    """
    ops = load_fused_ops(kind)
    for m in model.modules():
        m.fused_ops = ops
    select = getattr(ops, "select_linear_kernels", None)
    if select is not None and decode_gemv != "off":
        select(model, decode_gemv)
    attach = getattr(ops, "attach_layer_paths", None)
    if attach is not None:
        attach(model)
    return ops


def _use_fused(ops: ModuleType | None, x: torch.Tensor) -> ModuleType | None:
    return ops if ops is not None and ops.usable(x) else None


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        """``norm(x)``, or with ``residual``: ``(norm(x + residual), x + residual)``."""
        ops = _use_fused(fused_ops_of(self), x)
        if ops is not None:
            return ops.rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            x = x + residual
            residual = x
        dtype = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        out = self.weight * h.to(dtype)
        return out if residual is None else (out, residual)


def silu_and_mul(gate_up: torch.Tensor, ops: ModuleType | None = None) -> torch.Tensor:
    """``silu(gate) * up``; ``ops``: the caller's bound fused kernels (``fused_ops_of``)."""
    ops = _use_fused(ops, gate_up)
    if ops is not None:
        return ops.silu_and_mul(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


# RoPE types octavo computes exactly as transformers does. "longrope" (alias "su") and
# "dynamic" (NTK) depend on the sequence length as well: see ``models/length_rope.py``.
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "dynamic")


def rotary_dim(hf_config, head_dim: int, layer_type: str | None = None) -> int:
    """Dimensions of each head that RoPE rotates (``partial_rotary_factor`` of them)."""
    return int(head_dim * _rope_parameters(hf_config, layer_type).get("partial_rotary_factor", 1.0))


def compute_inv_freq(
    hf_config, head_dim: int, layer_type: str | None = None, seq_len=None
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (of the rotated dimensions) and attention scaling, as transformers
    computes them for a forward over ``seq_len`` tokens (None: its initial value)."""
    params = _rope_parameters(hf_config, layer_type)
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        base = params["rope_theta"]
        dim = rotary_dim(hf_config, head_dim, layer_type)
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
        factors = params.get("gguf_freq_factors")  # a GGUF's rope_freqs (models/gguf_rope.py)
        if factors is not None:
            inv_freq = inv_freq / torch.tensor(factors, dtype=torch.float32)
        return inv_freq, 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in SUPPORTED_ROPE_TYPES or rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(
            f"rope_scaling type {rope_type!r} is not supported (supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    kwargs = {"layer_type": layer_type} if layer_type is not None else {}
    if seq_len is not None:
        kwargs["seq_len"] = seq_len
    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu", **kwargs)
    return inv_freq.float(), float(attention_scaling)


def _cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float, dtype, device):
    """transformers' cos/sin of ``positions`` ([N]) at ``inv_freq`` ([D/2] or [N, D/2])."""
    freqs = positions.float()[:, None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scaling).to(dtype).to(device), (emb.sin() * scaling).to(dtype).to(device)


def _rope_tables(hf_config, head_dim: int, max_position: int, dtype, layer_type: str | None):
    """(cos, sin, per-length inverse frequencies or None), on the device the model is being
    built on (``torch.device`` context); computed on the CPU, as transformers computes them."""
    device = torch.empty(0).device
    with torch.device("cpu"):
        cos, sin, by_len = _rope_tables_on_cpu(hf_config, head_dim, max_position, dtype, layer_type)
    return cos.to(device), sin.to(device), None if by_len is None else by_len.to(device)


def _rope_tables_on_cpu(hf_config, head_dim: int, max_position: int, dtype, layer_type: str | None):
    device = torch.device("cpu")
    pos = torch.arange(max_position, dtype=torch.int64)
    lr = length_rope(hf_config, max_position) if layer_type is None else None
    inv_freq, scaling = compute_inv_freq(hf_config, head_dim, layer_type)
    cos, sin = _cos_sin(pos, inv_freq, scaling, dtype, device)
    if lr is None:
        return cos, sin, None
    if lr.kind == "longrope":  # rows [max_position, 2 max_position): the long factors
        long_freq, _ = compute_inv_freq(hf_config, head_dim, seq_len=lr.threshold + 1)
        long_cos, long_sin = _cos_sin(pos, long_freq, scaling, dtype, device)
        return torch.cat([cos, long_cos]), torch.cat([sin, long_sin]), None
    # dynamic: row r holds the frequencies transformers uses for seq_len = threshold + r.
    rows = [inv_freq] + [
        compute_inv_freq(hf_config, head_dim, seq_len=torch.tensor(lr.threshold + r))[0]
        for r in range(1, max(1, max_position - lr.threshold + 1))
    ]
    return cos, sin, torch.stack(rows).to(device)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


_ROPE_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


class RotaryEmbedding(nn.Module):
    """Neox-style RoPE with a precomputed cos/sin table indexed by absolute position.

    For length-dependent RoPE (``models/length_rope.py``) ``forward`` takes rope keys in place
    of positions: longrope keys index a table of twice ``max_position`` rows (short factors,
    then long); dynamic keys select a row of per-length frequencies (``inv_freq_by_len``) and
    cos/sin are computed per token.
    """

    def __init__(
        self, hf_config, head_dim: int, max_position: int, dtype: torch.dtype, layer_type: str | None = None
    ) -> None:
        super().__init__()
        # Built on the CPU (the same table on every device), then moved to the device the
        # model is being built on; layers of one model share one table.
        device = torch.empty(0).device
        key = (
            repr(_rope_parameters(hf_config, layer_type)), getattr(hf_config, "max_position_embeddings", None),
            getattr(hf_config, "original_max_position_embeddings", None), head_dim, max_position, dtype, device,
            layer_type,
        )
        tables = _ROPE_TABLES.get(key)
        if tables is None:
            tables = _rope_tables(hf_config, head_dim, max_position, dtype, layer_type)
            if len(_ROPE_TABLES) > 8:
                _ROPE_TABLES.clear()
            _ROPE_TABLES[key] = tables
        self.register_buffer("cos", tables[0], persistent=False)
        self.register_buffer("sin", tables[1], persistent=False)
        self.inv_freq_by_len = tables[2]
        self.stride = max_position
        if tables[2] is not None:
            with torch.device("cpu"):
                self.scaling = compute_inv_freq(hf_config, head_dim, layer_type)[1]
        else:
            self.scaling = 1.0

    def _tables(self, positions: torch.Tensor):
        """(cos table, sin table, row of each token)."""
        if self.inv_freq_by_len is None:
            return self.cos, self.sin, positions
        pos = positions % self.stride
        inv = self.inv_freq_by_len.to(positions.device)[positions // self.stride]
        cos, sin = _cos_sin(pos, inv, self.scaling, self.cos.dtype, self.cos.device)
        return cos, sin, torch.arange(len(positions), device=positions.device)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        """``q``: [T, H, D], ``k``: [T, Hk, D]; returns rotated copies (the first ``rotary_dim``
        dimensions rotated, the rest passed through, for a partial rotary factor)."""
        cos_t, sin_t, rows = self._tables(positions)
        rot = cos_t.shape[-1]
        if rot != q.shape[-1]:
            cos = cos_t[rows].unsqueeze(1)
            sin = sin_t[rows].unsqueeze(1)
            q_rot, k_rot = q[..., :rot], k[..., :rot]
            q_rot = q_rot * cos + rotate_half(q_rot) * sin
            k_rot = k_rot * cos + rotate_half(k_rot) * sin
            return torch.cat([q_rot, q[..., rot:]], dim=-1), torch.cat([k_rot, k[..., rot:]], dim=-1)
        ops = _use_fused(fused_ops_of(self), q)
        if ops is not None:
            return ops.rope(rows, q, k, cos_t, sin_t)
        cos = cos_t[rows].unsqueeze(1)
        sin = sin_t[rows].unsqueeze(1)
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

    def _fused_qk_norm_rope(self, q: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm):
        """The bound ``qk_norm_rope`` kernel when ``forward_qk_normed`` may take it (both norms
        this module's ``RMSNorm``: ``x / rms(x) * w``, not a subclass or another norm such as
        Gemma's ``* (1 + w)``; the whole head rotates), else None."""
        ops = _use_fused(fused_ops_of(self), q)
        fused = getattr(ops, "qk_norm_rope", None) if getattr(ops, "QK_NORM_ROPE_ENABLED", False) else None
        if (
            fused is not None and type(q_norm) is RMSNorm and type(k_norm) is RMSNorm
            and q_norm.eps == k_norm.eps and self.cos.shape[-1] == q.shape[-1]
            and q_norm.weight.dtype == q.dtype and k_norm.weight.dtype == q.dtype
        ):
            return fused
        return None

    def writes_kv(self, q: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm) -> bool:
        """Whether ``forward_qk_normed`` can take a ``kv_write`` for these arguments: the fused
        launch is taken and the bound kernels write the KV cache in it (``KV_WRITE_IN_ROPE``)."""
        ops = fused_ops_of(self)
        return getattr(ops, "KV_WRITE_IN_ROPE", False) and self._fused_qk_norm_rope(q, q_norm, k_norm) is not None

    def forward_qk_normed(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, q_norm: RMSNorm, k_norm: RMSNorm,
        kv_write: tuple | None = None,
    ):
        """``forward(positions, q_norm(q), k_norm(k))`` (Qwen3's per-head q/k norms): one fused
        launch where ``_fused_qk_norm_rope`` allows it, else the three ops. ``kv_write = (v,
        kv_cache, slot_mapping, k_scale, v_scale)``: the fused launch also writes the rotated k
        and v into the paged KV cache (only where ``writes_kv`` said so; else ValueError)."""
        fused = self._fused_qk_norm_rope(q, q_norm, k_norm)
        if fused is not None:
            cos_t, sin_t, rows = self._tables(positions)
            return fused(rows, q, k, q_norm.weight, k_norm.weight, q_norm.eps, cos_t, sin_t, kv_write=kv_write)
        if kv_write is not None:
            raise ValueError("kv_write needs the fused q/k norm + RoPE launch (RotaryEmbedding.writes_kv)")
        return self(positions, q_norm(q), k_norm(k))
