"""``genai_config.json``: how ONNX Runtime GenAI (and tools reading its schema) drive the model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def _first(value: Any) -> Any:
    return value[0] if isinstance(value, list) and value else value


def _generation_defaults(model_dir: str) -> dict[str, Any]:
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    with open(path) as f:
        return json.load(f)


def genai_config(hf_config: Any, shape: Any, context_length: int, model_dir: str) -> dict[str, Any]:
    """The config in ONNX Runtime GenAI's schema (``model.decoder`` names the I/O tensors;
    ``search`` holds the generation defaults, from ``generation_config.json`` where it has them).
    ``past_present_share_buffer`` is false: presents are past ++ new, not written in place."""
    gen = _generation_defaults(model_dir)
    eos = gen.get("eos_token_id", getattr(hf_config, "eos_token_id", None))
    return {
        "model": {
            "bos_token_id": _first(gen.get("bos_token_id", getattr(hf_config, "bos_token_id", None))),
            "context_length": context_length,
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": shape.head_size,
                "hidden_size": shape.hidden_size,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
                "num_attention_heads": shape.num_heads,
                "num_hidden_layers": shape.num_layers,
                "num_key_value_heads": shape.num_kv_heads,
            },
            "eos_token_id": eos,
            "pad_token_id": getattr(hf_config, "pad_token_id", None) or _first(eos),
            "type": hf_config.model_type,
            "vocab_size": shape.vocab_size,
        },
        "search": {
            "diversity_penalty": 0.0,
            "do_sample": bool(gen.get("do_sample", False)),
            "early_stopping": True,
            "length_penalty": 1.0,
            "max_length": context_length,
            "min_length": 0,
            "no_repeat_ngram_size": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,
            "repetition_penalty": float(gen.get("repetition_penalty", 1.0)),
            "temperature": float(gen.get("temperature", 1.0)),
            "top_k": int(gen.get("top_k", 50)),
            "top_p": float(gen.get("top_p", 1.0)),
        },
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(data, f, indent=4)
        f.write("\n")


def read_genai_config(model_dir: str) -> dict[str, Any] | None:
    """The folder's ``genai_config.json``, or None when it has none."""
    path = Path(model_dir) / "genai_config.json"
    if not path.is_file():
        return None
    with open(path) as f:
        return json.load(f)
