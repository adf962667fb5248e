"""What a folder written by ``octavo export onnx`` holds, read without starting ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import torch

MODEL_FILE = "model.onnx"
GENAI_CONFIG = "genai_config.json"
_ONNX_FLOAT_TYPES = {1: torch.float32, 10: torch.float16}  # onnx.TensorProto.FLOAT, FLOAT16


def is_onnx_export(path: str) -> bool:
    """An exported decoder folder: ``model.onnx`` and ``genai_config.json``, no torch weights."""
    d = Path(path)
    if not d.is_dir() or not (d / MODEL_FILE).is_file() or not (d / GENAI_CONFIG).is_file():
        return False
    return not any(d.glob("*.safetensors")) and not any(d.glob("pytorch_model*.bin"))


def require_onnx_export(path: str) -> None:
    d = Path(path)
    missing = [n for n in (MODEL_FILE, GENAI_CONFIG) if not (d / n).is_file()]
    if missing:
        raise ValueError(
            f"--model-impl onnxruntime runs a folder written by `octavo export onnx`; {path!r} has no "
            f"{' or '.join(missing)}"
        )


def export_kv_dtype(path: str) -> torch.dtype:
    """The dtype of the model's KV cache inputs (its activation dtype; logits are float32)."""
    import onnx

    proto = onnx.load(str(Path(path) / MODEL_FILE), load_external_data=False)
    for value in proto.graph.input:
        if value.name == "past_key_values.0.key":
            elem = value.type.tensor_type.elem_type
            if elem not in _ONNX_FLOAT_TYPES:
                raise ValueError(f"{path}: KV cache element type {elem} is neither float32 nor float16")
            return _ONNX_FLOAT_TYPES[elem]
    raise ValueError(f"{path}/{MODEL_FILE} has no input past_key_values.0.key (not a decoder with a KV cache)")
