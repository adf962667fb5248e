"""Quantize a float32 fixture checkpoint into each on-disk layout octavo reads.

Every writer returns (quantized checkpoint folder, dequantized state dict): the float32 weights
the quantized tensors stand for (scales rounded to their on-disk dtype first), which
``write_dequantized`` saves as a plain checkpoint for transformers to run as the reference.
Packing is written here from the formats' definitions (not with octavo's unpacker), so a
mistake in either shows up as a mismatch.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds column AWQ_ORDER[i]


def is_linear(name: str) -> bool:
    return name.endswith(".weight") and name.split(".")[-2] in LINEARS


def pack(codes: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """int32 words of ``32 // bits`` codes along ``dim``; word slot ``i`` holds entry ``order[i]``."""
    per = 32 // bits
    c = codes.to(torch.int64).movedim(dim, -1)
    c = torch.nn.functional.pad(c, (0, (-c.shape[-1]) % per)).reshape(*c.shape[:-1], -1, per)
    order = order or tuple(range(per))
    words = sum(c[..., order[i]] << (bits * i) for i in range(per))
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).movedim(-1, dim).contiguous()


def quant_int(w: torch.Tensor, bits: int, group: int, sym: bool, scale_dtype=torch.bfloat16):
    """(codes uint8 [N, K], scales [N, K/g] in ``scale_dtype``, zeros uint8 [N, K/g], dequantized)."""
    n, k = w.shape
    wg = w.reshape(n, k // group, group)
    top = (1 << bits) - 1
    if sym:
        scale = (wg.abs().amax(-1) / ((top - 1) / 2)).to(scale_dtype).float()
        zero = torch.full_like(scale, 1 << (bits - 1))
    else:
        lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
        scale = ((hi - lo) / top).to(scale_dtype).float()
        zero = torch.round(-lo / scale).clamp(0, top)
    q = torch.round(wg / scale[..., None] + zero[..., None]).clamp(0, top)
    deq = ((q - zero[..., None]) * scale[..., None]).reshape(n, k)
    return q.reshape(n, k).to(torch.uint8), scale.to(scale_dtype), zero.to(torch.uint8), deq


def _copy(src: str | Path, dst: Path, quant_config: dict | None) -> dict[str, torch.Tensor]:
    shutil.copytree(src, dst)
    if quant_config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        cfg["quantization_config"] = quant_config
        (dst / "config.json").write_text(json.dumps(cfg))
    return load_file(str(dst / "model.safetensors"))


def write_dequantized(src: str | Path, dst: Path, deq: dict[str, torch.Tensor]) -> Path:
    """A plain float32 checkpoint with the dequantized linear weights."""
    tensors = _copy(src, dst, None)
    tensors.update(deq)
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


def ct_weight_only(src, dst: Path, bits: int, group: int | None, sym: bool, packed: bool = True,
                   actorder: bool = False):
    """compressed-tensors W4A16/W8A16 (``pack-quantized``, or ``int-quantized`` unpacked);
    ``actorder``: GPTQ act-order groups (``actorder: group``, ``weight_g_idx``)."""
    strategy = "group" if group else "channel"
    qc = {
        "quant_method": "compressed-tensors", "format": "pack-quantized" if packed else "int-quantized",
        "quantization_status": "compressed", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": None, "weights": {
            "num_bits": bits, "type": "int", "symmetric": sym, "strategy": strategy, "group_size": group,
            "dynamic": False, "actorder": "group" if actorder else None, "observer": "minmax"}}},
    }
    tensors, out, deq = _copy(src, dst, qc), {}, {}
    off = 1 << (bits - 1)
    orders: dict[tuple[str, int], torch.Tensor] = {}
    gen = torch.Generator().manual_seed(1)
    for name, t in tensors.items():
        if not is_linear(name):
            out[name] = t
            continue
        base = name.removesuffix("weight")
        k = t.shape[1]
        order = orders.setdefault((_input_key(name), k), torch.randperm(k, generator=gen) if actorder else torch.arange(k))
        q, s, z, d = quant_int(t[:, order], bits, group or k, sym)
        inv = torch.argsort(order)
        q, deq[name] = q[:, inv].contiguous(), d[:, inv]
        if actorder:
            g_idx = torch.empty(k, dtype=torch.int32)
            g_idx[order] = (torch.arange(k) // group).to(torch.int32)
            out[base + "weight_g_idx"] = g_idx
        if packed:
            out[base + "weight_packed"] = pack(q, bits, 1)
            out[base + "weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int64)
        else:
            out[base + "weight"] = (q.to(torch.int16) - off).to(torch.int8)
        out[base + "weight_scale"] = s
        if not sym:
            zs = pack(z, bits, 0) if packed else (z.to(torch.int16) - off).to(torch.int8)
            out[base + "weight_zero_point"] = zs
    save_file(out, str(dst / "model.safetensors"))
    return dst, deq


def awq(src, dst: Path, group: int):
    """AutoAWQ GEMM: qweight [K, N/8], qzeros [K/g, N/8] in AWQ nibble order, scales [K/g, N] fp16."""
    qc = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm",
          "modules_to_not_convert": None}
    tensors, out, deq = _copy(src, dst, qc), {}, {}
    for name, t in tensors.items():
        if not is_linear(name):
            out[name] = t
            continue
        base = name.removesuffix("weight")
        q, s, z, deq[name] = quant_int(t, 4, group, sym=False, scale_dtype=torch.float16)
        out[base + "qweight"] = pack(q.T, 4, 1, AWQ_ORDER)
        out[base + "qzeros"] = pack(z.T, 4, 1, AWQ_ORDER)
        out[base + "scales"] = s.T.contiguous()
    save_file(out, str(dst / "model.safetensors"))
    return dst, deq


def gptq(src, dst: Path, group: int, desc_act: bool, sym: bool = True, seed: int = 0):
    """AutoGPTQ (v1): qweight [K/8, N] packed along K, qzeros [G, N/8] storing zero - 1,
    scales [G, N] fp16, g_idx [K]. With ``desc_act`` every layer reading the same input shares
    one random channel order (as GPTQ's act-order gives q/k/v and gate/up)."""
    qc = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": desc_act, "sym": sym,
          "static_groups": False, "true_sequential": True, "damp_percent": 0.01, "checkpoint_format": "gptq"}
    tensors, out, deq = _copy(src, dst, qc), {}, {}
    gen = torch.Generator().manual_seed(seed)
    orders: dict[tuple[str, int], torch.Tensor] = {}
    for name, t in tensors.items():
        if not is_linear(name):
            out[name] = t
            continue
        base = name.removesuffix("weight")
        n, k = t.shape
        key = (_input_key(name), k)
        if key not in orders:
            orders[key] = torch.randperm(k, generator=gen) if desc_act else torch.arange(k)
        order = orders[key]  # the act-order: order[j] is the j-th channel quantized
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[order] = (torch.arange(k) // group).to(torch.int32)
        q, s, z, d = quant_int(t[:, order], 4, group, sym, scale_dtype=torch.float16)
        inv = torch.argsort(order)
        q, deq[name] = q[:, inv], d[:, inv]
        if not sym:
            z = z.clamp(min=1)  # v1 stores zero - 1
            d = ((q[:, order].float() - z.float().repeat_interleave(group, 1)) * s.float().repeat_interleave(group, 1))
            deq[name] = d[:, inv]
        out[base + "qweight"] = pack(q.T, 4, 0)
        out[base + "qzeros"] = pack((z.to(torch.int16) - 1).T.to(torch.uint8), 4, 1)
        out[base + "scales"] = s.T.contiguous()
        out[base + "g_idx"] = g_idx
    save_file(out, str(dst / "model.safetensors"))
    return dst, deq


def _input_key(name: str) -> str:
    """Layers that read the same input share an act-order (q/k/v; gate/up)."""
    proj = name.split(".")[-2]
    group = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gu", "up_proj": "gu"}.get(proj, proj)
    return name.rsplit(".", 2)[0] + "." + group


FP8_MAX = 448.0


def fp8_quant(w: torch.Tensor, scale: torch.Tensor):
    """(e4m3 weight, dequantized float32) for a scale broadcastable to ``w``."""
    q = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, q.float() * scale


def ct_fp8(src, dst: Path, weight_strategy: str, static_scales: dict[str, float] | None = None):
    """compressed-tensors FP8 W8A8 (``float-quantized``): per-tensor or per-channel weight
    scales; activations dynamic per token, or static with ``static_scales[layer prefix]``."""
    act = ({"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor", "dynamic": False}
           if static_scales else {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True})
    qc = {"quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
          "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": act,
          "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": weight_strategy, "dynamic": False}}}}
    tensors, out, deq = _copy(src, dst, qc), {}, {}
    for name, t in tensors.items():
        if not is_linear(name):
            out[name] = t
            continue
        base = name.removesuffix("weight")
        amax = t.abs().amax(dim=1, keepdim=True) if weight_strategy == "channel" else t.abs().amax().reshape(1)
        scale = amax / FP8_MAX
        out[name], deq[name] = fp8_quant(t, scale if scale.dim() == 2 else scale.reshape(1, 1))
        out[base + "weight_scale"] = scale.float()
        if static_scales:
            out[base + "input_scale"] = torch.tensor([static_scales[base.rstrip(".")]], dtype=torch.float32)
    save_file(out, str(dst / "model.safetensors"))
    return dst, deq


def ct_int8_w8a8(src, dst: Path):
    """compressed-tensors INT8 W8A8 (``int-quantized``): per-channel int8 weights, dynamic
    per-token symmetric int8 activations."""
    qc = {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
          "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": ["Linear"],
          "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
          "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False}}}}
    tensors, out, deq = _copy(src, dst, qc), {}, {}
    for name, t in tensors.items():
        if not is_linear(name):
            out[name] = t
            continue
        scale = t.abs().amax(dim=1, keepdim=True) / 127.0
        q = torch.round(t / scale).clamp(-127, 127)
        out[name], deq[name] = q.to(torch.int8), q * scale
        out[name.removesuffix("weight") + "weight_scale"] = scale.float()
    save_file(out, str(dst / "model.safetensors"))
    return dst, deq


def fp8_block(src, dst: Path, block: int = 128):
    """vLLM ``fp8`` with ``weight_block_size`` (DeepSeek style): ``weight_scale_inv`` per
    block of ``block`` x ``block``, dynamic activations."""
    qc = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [block, block], "fmt": "e4m3"}
    tensors, out, deq = _copy(src, dst, qc), {}, {}
    for name, t in tensors.items():
        if not is_linear(name):
            out[name] = t
            continue
        n, k = t.shape
        blocks = t.reshape(n // block, block, k // block, block)
        scale = blocks.abs().amax(dim=(1, 3)) / FP8_MAX  # [N/b, K/b]
        full = scale.repeat_interleave(block, 0).repeat_interleave(block, 1)
        out[name], deq[name] = fp8_quant(t, full)
        out[name.removesuffix("weight") + "weight_scale_inv"] = scale.float()
    save_file(out, str(dst / "model.safetensors"))
    return dst, deq


def ct_fp8_block(src, dst: Path, block: int = 128):
    """compressed-tensors FP8 with 128x128 block weight scales and per-token-group (128)
    dynamic activations (llm-compressor's FP8_BLOCK scheme)."""
    _, deq = fp8_block(src, dst, block)
    tensors = load_file(str(dst / "model.safetensors"))
    out = {k.replace("weight_scale_inv", "weight_scale"): v for k, v in tensors.items()}
    save_file(out, str(dst / "model.safetensors"))
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "float-quantized", "quantization_status": "compressed",
        "ignore": ["lm_head"], "config_groups": {"group_0": {"targets": ["Linear"],
        "input_activations": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group",
                              "group_size": block, "dynamic": True},
        "weights": {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block",
                    "block_structure": [block, block], "dynamic": False}}},
    }
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst, deq


def fp8_per_tensor(src, dst: Path, static_scales: dict[str, float] | None = None):
    """vLLM ``fp8`` (``Fp8Config``) with one ``weight_scale`` [] per tensor; activations dynamic
    or ``static`` with ``input_scale`` [] from ``static_scales[layer prefix]``."""
    qc = {"quant_method": "fp8", "activation_scheme": "static" if static_scales else "dynamic"}
    tensors, out, deq = _copy(src, dst, qc), {}, {}
    for name, t in tensors.items():
        if not is_linear(name):
            out[name] = t
            continue
        base = name.removesuffix("weight")
        scale = t.abs().amax() / FP8_MAX
        out[name], deq[name] = fp8_quant(t, scale)
        out[base + "weight_scale"] = scale.float().reshape(())
        if static_scales:
            out[base + "input_scale"] = torch.tensor(static_scales[base.rstrip(".")], dtype=torch.float32)
    save_file(out, str(dst / "model.safetensors"))
    return dst, deq
