"""Quantization methods: the registry every quantized checkpoint and ``--quantization`` goes through.

A checkpoint whose ``config.json`` carries a ``quantization_config`` stores tensors octavo must
honour (``weight_scale``, ``qweight``/``scales``/``qzeros``, ...). Loading such a checkpoint as if
it were unquantized yields garbage, so the rule here is strict: a method is either registered
(and then it loads its own tensors and applies its own kernel) or it is refused at load with one
line naming the method and the supported ones. Nothing is silently dequantized or skipped.

``QUANTIZATION_METHODS`` maps vLLM's method names to the module implementing each; it is empty
until a method lands, so today every quantized checkpoint and every ``--quantization`` value is
refused with a clear message.
"""

from __future__ import annotations

from typing import Any

# vLLM's method name -> qualified path of the octavo class implementing it.
QUANTIZATION_METHODS: dict[str, str] = {}

# Every value vLLM accepts for --quantization: named in errors so a user coming from vLLM
# learns that octavo knows the method and does not run it yet (rather than "unknown").
VLLM_METHOD_NAMES: tuple[str, ...] = (
    "aqlm", "awq", "awq_marlin", "bitblas", "bitsandbytes", "compressed-tensors", "deepspeedfp",
    "experts_int8", "fbgemm_fp8", "fp8", "gguf", "gptq", "gptq_bitblas", "gptq_marlin",
    "hqq", "ipex", "marlin", "modelopt", "modelopt_fp4", "moe_wna16", "mxfp4", "petit_nvfp4",
    "ptpc_fp8", "quark", "torchao", "tpu_int8",
)


def supported_methods(platform_methods: tuple[str, ...] = ()) -> list[str]:
    """Methods that are both implemented here and allowed by the platform."""
    return sorted(m for m in QUANTIZATION_METHODS if m in platform_methods)


def checkpoint_method(hf_quant_config: Any) -> str | None:
    """The method named by a checkpoint's ``quantization_config`` (None if it has none)."""
    if hf_quant_config is None:
        return None
    cfg = hf_quant_config if isinstance(hf_quant_config, dict) else vars(hf_quant_config)
    method = cfg.get("quant_method") or cfg.get("quantization_method")
    if method is None:
        keys = ", ".join(sorted(cfg)) or "none"
        raise ValueError(
            f"the checkpoint's quantization_config names no quant_method (keys: {keys}); "
            "octavo cannot tell how its tensors are stored and refuses to load it"
        )
    return str(method).lower()


def resolve_quantization(
    requested: str | None, hf_quant_config: Any, platform_name: str, platform_methods: tuple[str, ...]
) -> str | None:
    """The method this engine runs, or ``ValueError`` naming what cannot be honoured.

    ``requested`` is ``--quantization``; ``hf_quant_config`` the checkpoint's
    ``quantization_config``. A request that contradicts the checkpoint is an error, as in vLLM.
    """
    from_ckpt = checkpoint_method(hf_quant_config)
    if requested is not None and from_ckpt is not None and requested != from_ckpt:
        raise ValueError(
            f"--quantization (quantization) {requested!r} does not match the checkpoint's "
            f"quantization_config method {from_ckpt!r}"
        )
    method = requested or from_ckpt
    if method is None:
        return None
    supported = supported_methods(platform_methods)
    source = "--quantization (quantization)" if requested else "the checkpoint's quantization_config"
    if method not in QUANTIZATION_METHODS:
        known = " (a vLLM method octavo does not implement yet)" if method in VLLM_METHOD_NAMES else ""
        raise ValueError(
            f"{source} asks for quantization method {method!r}{known}; octavo supports: "
            f"{', '.join(supported) or 'none yet (unquantized checkpoints only)'}"
        )
    if method not in supported:
        raise ValueError(
            f"{source} asks for quantization method {method!r}, which the {platform_name} platform "
            f"cannot run; supported here: {', '.join(supported) or 'none'}"
        )
    return method
