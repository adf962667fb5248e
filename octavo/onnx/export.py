"""``octavo export onnx``: octavo's decoder as an ONNX model ONNX Runtime runs anywhere.

The folder written holds ``model.onnx`` (+ ``model.onnx.data``, the weights), the checkpoint's
tokenizer files, ``config.json`` and ``generation_config.json`` unchanged, and a
``genai_config.json`` in ONNX Runtime GenAI's schema. Inputs and outputs use the names and
layout ONNX Runtime GenAI and transformers.js expect (see ``export_attention``); the logits
are float32 for every export dtype.

Export runs ``torch.onnx.export`` with the ``torch.export``-based exporter (the default and
maintained one since PyTorch 2.9) on ``ExportDecoder``, traced with batch, sequence and past
lengths all > 1 and marked dynamic. ``--quantize int4|int8`` then rewrites every weight
MatMul into ONNX Runtime's ``MatMulNBits`` with its own quantizer (block-wise, symmetric).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from octavo.onnx.genai_config import genai_config, write_json
from octavo.onnx.graph import gemm_to_matmul, name_total_length

logger = logging.getLogger(__name__)

EXPORT_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
QUANT_BITS = {"int4": 4, "int8": 8}
QUANT_BLOCK_SIZE = 32
MODEL_FILE = "model.onnx"
# Files of a checkpoint folder an exported model carries along (tokenizer, configs, templates).
CARRIED_FILES = (
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json", "vocab.json", "vocab.txt", "merges.txt",
    "tokenizer.model", "chat_template.jinja", "chat_template.json",
)


@dataclass(frozen=True)
class ExportShape:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_size: int
    hidden_size: int
    vocab_size: int

    @classmethod
    def of(cls, hf_config: Any) -> ExportShape:
        heads = hf_config.num_attention_heads
        return cls(
            num_layers=hf_config.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or heads,
            head_size=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
            hidden_size=hf_config.hidden_size,
            vocab_size=hf_config.vocab_size,
        )

    def input_names(self) -> list[str]:
        kv = [f"past_key_values.{i}.{t}" for i in range(self.num_layers) for t in ("key", "value")]
        return ["input_ids", "attention_mask", "position_ids", *kv]

    def output_names(self) -> list[str]:
        return ["logits", *(f"present.{i}.{t}" for i in range(self.num_layers) for t in ("key", "value"))]


def check_export_args(dtype: str, quantize: str | None) -> None:
    if dtype not in EXPORT_DTYPES:
        raise ValueError(f"--dtype must be one of {', '.join(EXPORT_DTYPES)}; got {dtype!r}")
    if quantize is not None and quantize not in QUANT_BITS:
        raise ValueError(f"--quantize must be one of {', '.join(QUANT_BITS)}; got {quantize!r}")
    if quantize is not None and dtype != "fp32":
        raise ValueError(f"--quantize {quantize} quantizes a float32 export; drop --dtype {dtype}")


def check_position_only_rope(hf_config: Any, context: int) -> None:
    """The exported graph rotates q/k by ``position_ids`` alone. RoPE whose rotation also
    depends on the sequence's length (longrope past ``original_max_position_embeddings``,
    dynamic NTK past ``max_position_embeddings``) cannot be expressed that way: refused, naming
    the context that would export exactly."""
    from octavo.models.length_rope import length_rope

    lr = length_rope(hf_config, context)
    if lr is not None and lr.kind == "dynamic":
        raise ValueError(
            "this model's dynamic RoPE depends on the sequence length beyond "
            f"{lr.threshold} tokens; octavo's ONNX export does not support dynamic NTK scaling"
        )
    if lr is not None and context > lr.threshold:
        raise ValueError(
            f"this model's {lr.kind} RoPE depends on the sequence length beyond {lr.threshold} tokens, "
            f"which an exported graph (rotation by position_ids only) cannot reproduce; export with "
            f"--max-model-len {lr.threshold} or less"
        )


def export_onnx(model_dir: str, hf_config: Any, architecture: str, output: str, dtype: str = "fp32",
                quantize: str | None = None, max_model_len: int | None = None) -> Path:
    """Write the exported model folder ``output``; returns its path. ``max_model_len``: the
    longest context (the RoPE tables' length; default the model's ``max_position_embeddings``)."""
    import onnx

    from octavo.onnx.decoder import ExportDecoder, load_octavo_model

    check_export_args(dtype, quantize)
    out = Path(output)
    if (out / MODEL_FILE).exists():
        raise ValueError(f"{out / MODEL_FILE} exists; choose an empty --output folder")
    context = max_model_len or getattr(hf_config, "max_position_embeddings", None) or 2048
    check_position_only_rope(hf_config, context)
    t0 = time.perf_counter()
    model = load_octavo_model(model_dir, hf_config, architecture, EXPORT_DTYPES[dtype], context)
    shape = ExportShape.of(hf_config)
    with tempfile.TemporaryDirectory() as tmp:
        traced = Path(tmp) / MODEL_FILE
        _trace(ExportDecoder(model, shape.num_layers).eval(), shape, EXPORT_DTYPES[dtype], traced)
        del model
        proto = onnx.load(traced)
    name_total_length(proto)
    if quantize is not None:
        proto = _quantize(proto, QUANT_BITS[quantize])
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(proto, out / MODEL_FILE, save_as_external_data=True, all_tensors_to_one_file=True,
              location=MODEL_FILE + ".data", size_threshold=1024)
    _readable(out / (MODEL_FILE + ".data"))
    _copy_carried_files(Path(model_dir), out)
    write_json(out / "genai_config.json", genai_config(hf_config, shape, context, model_dir))
    logger.info("exported %s (%s%s) to %s in %.1fs", architecture, dtype,
                f", {quantize} weights" if quantize else "", out, time.perf_counter() - t0)
    return out


def _trace(decoder: torch.nn.Module, shape: ExportShape, dtype: torch.dtype, path: Path) -> None:
    from torch.export import Dim

    from octavo.onnx.decoder import sample_inputs

    inputs = sample_inputs(2, 3, 4, shape.num_layers, shape.num_kv_heads, shape.head_size, dtype, shape.vocab_size)
    batch = Dim("batch_size", min=1, max=1 << 16)
    seq = Dim("sequence_length", min=1, max=1 << 20)
    past = Dim("past_sequence_length", min=0, max=1 << 20)
    kv = tuple({0: batch, 2: past} for _ in range(2 * shape.num_layers))
    dynamic = ({0: batch, 1: seq}, {0: batch, 1: Dim.AUTO}, {0: batch, 1: seq}, kv)
    # The exporter logs a warning per torchvision op it cannot register; octavo needs none.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    with torch.no_grad(), warnings.catch_warnings():
        # The exporter notes that axes sharing a Dim keep one name: that is the intent here.
        warnings.filterwarnings("ignore", message=".*will not be used, since it shares the same shape")
        torch.onnx.export(
            decoder, inputs, str(path), input_names=shape.input_names(), output_names=shape.output_names(),
            dynamic_shapes=dynamic, dynamo=True, optimize=True, external_data=True, verbose=False,
        )


def _quantize(proto, bits: int):
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    gemm_to_matmul(proto)
    quantizer = MatMulNBitsQuantizer(proto, bits=bits, block_size=QUANT_BLOCK_SIZE, is_symmetric=True,
                                     accuracy_level=4)
    log = logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer")
    level = log.level
    log.setLevel(logging.WARNING)  # it logs every node it visits at INFO
    try:
        quantizer.process()
    finally:
        log.setLevel(level)
    return quantizer.model.model


def _readable(path: Path) -> None:
    """onnx writes external data owner-only; give it the permissions of any new file."""
    if path.exists():
        umask = os.umask(0)
        os.umask(umask)
        path.chmod(0o666 & ~umask)


def _copy_carried_files(src: Path, dst: Path) -> None:
    for name in CARRIED_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)
