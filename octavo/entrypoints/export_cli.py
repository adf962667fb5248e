"""``octavo export onnx MODEL --output DIR``: write a model in a format other runtimes run."""

from __future__ import annotations

import argparse

from octavo.utils.extras import require_extra


def add_export_parser(sub) -> None:
    export = sub.add_parser("export", help="export a model for another runtime (ONNX Runtime)")
    esub = export.add_subparsers(dest="export_format", required=True)
    onnx = esub.add_parser(
        "onnx", help="an ONNX decoder with explicit KV cache inputs, tokenizer files and genai_config.json",
        description="Export octavo's decoder for MODEL as ONNX (the input/output layout of ONNX Runtime "
        "GenAI and transformers.js), with the tokenizer files and a genai_config.json. Serve it with "
        "`octavo serve DIR --model-impl onnxruntime`.",
    )
    onnx.add_argument("model", help="model folder or Hugging Face Hub id")
    onnx.add_argument("--output", required=True, help="folder to write (must not hold a model.onnx yet)")
    onnx.add_argument("--dtype", default="fp32", choices=("fp32", "fp16"), help="weight and activation dtype (default: %(default)s)")
    onnx.add_argument("--quantize", default=None, choices=("int4", "int8"),
                      help="quantize the weights of every linear layer with ONNX Runtime's MatMulNBits (block 32, symmetric)")
    onnx.add_argument("--max-model-len", type=int, default=None,
                      help="longest context the model serves (default: the model's max_position_embeddings)")
    onnx.add_argument("--revision", default=None, help="Hub revision of MODEL (Hub ids only)")
    onnx.set_defaults(func=cmd_export)


def cmd_export(args: argparse.Namespace) -> int:
    require_extra("onnx", "`octavo export onnx`")
    from octavo.engine.model_files import load_hf_config, resolve_model_path
    from octavo.onnx.export import check_export_args, export_onnx

    check_export_args(args.dtype, args.quantize)
    if args.max_model_len is not None and args.max_model_len < 1:
        raise ValueError(f"--max-model-len must be >= 1; got {args.max_model_len}")
    model_dir = resolve_model_path(args.model, args.revision)
    if model_dir.endswith(".gguf"):
        raise ValueError("octavo export onnx reads a Hugging Face folder (config.json, safetensors), not a .gguf file")
    hf_config, arch = load_hf_config(model_dir)
    out = export_onnx(model_dir, hf_config, arch, args.output, args.dtype, args.quantize, args.max_model_len)
    print(f"wrote {out} (serve it: octavo serve {out} --model-impl onnxruntime)")
    return 0
