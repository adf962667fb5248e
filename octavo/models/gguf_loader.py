"""GGUF files (llama.cpp's format) for Llama-family models, read with the ``gguf`` package.

- config: transformers builds it from the GGUF metadata (``AutoConfig(gguf_file=...)``); octavo
  adds ``architectures``, reads Llama-3 RoPE scaling from the ``rope_freqs`` tensor
  (``gguf_rope``) and refuses metadata it would otherwise silently drop (``rope.scaling.*``).
- tokenizer: transformers builds it from the GGUF metadata too (``load_tokenizer``), unless
  ``--tokenizer`` names another.
- weights: tensors are renamed to HF names, dequantized one at a time to float32 (F32, F16,
  BF16, Q8_0) and streamed into the model; llama.cpp's q/k row permutation (Llama only) is
  undone. Other tensor types are refused by name.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import torch

# GGUF ``general.architecture`` -> HF architecture (llama.cpp writes Mistral as llama).
GGUF_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
# Architectures whose q/k rows llama.cpp's converter permutes (to interleaved RoPE).
_PERMUTED = {"llama", "mistral"}

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Llama-3 RoPE scaling factors, one per rotated frequency (llama.cpp's ``LLM_TENSOR_ROPE_FREQS``).
ROPE_FREQS = "rope_freqs.weight"
_LAYER_RE = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")


def _reader(path: str):
    try:
        from gguf import GGUFReader
    except ImportError:
        raise ValueError(f"--model {path!r} is a GGUF file: install the gguf package (pip install 'octavo[gguf]')") from None

    return GGUFReader(path)


def _field(reader, key: str):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def gguf_architecture(reader) -> str:
    arch = _field(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported (supported: {', '.join(sorted(GGUF_ARCHITECTURES))})"
        )
    return arch


def load_gguf_config(path: str):
    """HF config of a GGUF file, with ``architectures`` set; unsupported metadata is an error."""
    from transformers import AutoConfig

    reader = _reader(path)
    arch = gguf_architecture(reader)
    scaling = [k for k in reader.fields if k.startswith(f"{arch}.rope.scaling.")]
    if scaling:
        raise ValueError(
            f"GGUF {path!r}: RoPE scaling in GGUF metadata ({', '.join(scaling)}) is not supported; "
            "use the model's HF checkpoint"
        )
    rope_freqs = None
    for t in reader.tensors:  # refuse before anything is allocated
        _check_type(t)
        if t.name == ROPE_FREQS:
            rope_freqs = t
        else:
            hf_name(t.name)
    cfg = AutoConfig.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path))
    cfg.architectures = [GGUF_ARCHITECTURES.get(cfg.model_type, GGUF_ARCHITECTURES[arch])]
    head_dim = _field(reader, f"{arch}.attention.key_length")  # not mapped by transformers for every arch
    if head_dim is not None:
        cfg.head_dim = int(head_dim)
    if rope_freqs is not None:
        _apply_rope_freqs(cfg, reader, arch, dequantize(rope_freqs))
    return cfg


def _apply_rope_freqs(cfg, reader, arch: str, factors: torch.Tensor) -> None:
    """Llama-3 RoPE scaling from ``rope_freqs.weight`` (see ``gguf_rope``) into ``cfg``."""
    from octavo.models.gguf_rope import rope_parameters_from_factors

    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    dim = int(_field(reader, f"{arch}.rope.dimension_count") or head_dim)
    if dim != head_dim:
        raise ValueError(f"GGUF rope_freqs.weight with a partial rotary dimension ({dim} of {head_dim}) is not supported")
    base = float(_field(reader, f"{arch}.rope.freq_base") or 10000.0)
    cfg.rope_parameters = rope_parameters_from_factors(factors.numpy(), base, dim)


def hf_name(gguf_name: str) -> str:
    """HF checkpoint name of a GGUF tensor name (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.fullmatch(gguf_name)
    if m is None or m.group(2) not in _LAYER_NAMES:
        raise ValueError(f"GGUF tensor {gguf_name!r} has no counterpart in octavo's model")
    return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.{m.group(3)}"


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's ``permute`` of q/k rows (interleaved RoPE pairs -> HF's rotate-half)."""
    dim = w.shape[0] // n_head // 2
    return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


SUPPORTED_TYPES = ("F32", "F16", "BF16", "Q8_0")


def _check_type(t) -> None:
    if t.tensor_type.name not in SUPPORTED_TYPES:
        raise ValueError(
            f"GGUF tensor {t.name!r} has type {t.tensor_type.name}; octavo dequantizes {', '.join(SUPPORTED_TYPES)}"
        )


def dequantize(t) -> torch.Tensor:
    """One reader tensor as float32 in HF's (row-major, reversed-ggml) shape."""
    from gguf import GGMLQuantizationType, quants

    _check_type(t)
    data = t.data
    if t.tensor_type == GGMLQuantizationType.F32:
        arr = data
    else:
        arr = quants.dequantize(data, t.tensor_type)
    shape = tuple(int(d) for d in reversed(t.shape.tolist()))
    return torch.from_numpy(arr.astype("float32", copy=False).reshape(shape).copy())


def iter_gguf_tensors(path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, float32 tensor) for every tensor of the file, one at a time (memory-mapped)."""
    reader = _reader(path)
    arch = gguf_architecture(reader)
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    n_kv = int(_field(reader, f"{arch}.attention.head_count_kv") or n_head)
    for t in reader.tensors:
        if t.name == ROPE_FREQS:  # read into the config (RoPE scaling), not a weight
            continue
        name = hf_name(t.name)
        w = dequantize(t)
        if arch in _PERMUTED and name.endswith(("q_proj.weight", "k_proj.weight")):
            w = unpermute_qk(w, n_head if "q_proj" in name else n_kv)
        yield name, w
