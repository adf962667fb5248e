"""Quantization methods: the registry every quantized checkpoint and ``--quantization`` goes through.

A checkpoint whose ``config.json`` carries a ``quantization_config`` stores tensors octavo must
honour (``weight_scale``, ``qweight``/``scales``/``qzeros``, ...). Loading such a checkpoint as if
it were unquantized yields garbage, so the rule here is strict: a method is either registered
(and then it loads its own tensors and applies its own kernel) or it is refused at load with one
line naming the method and the supported ones. Nothing is silently dequantized or skipped.

``QUANTIZATION_METHODS`` maps vLLM's method names to the ``QuantizationConfig`` implementing
each (``base.py``: config -> ``LinearMethod`` -> canonical weight -> kernel). Each platform lists
the methods it runs (``Platform.supported_quantization``) and those it may apply to an
unquantized checkpoint at load (``supported_online_quantization``); other pairs are refused.
"""

from __future__ import annotations

from typing import Any

# vLLM's method name -> qualified path of the octavo class implementing it.
QUANTIZATION_METHODS: dict[str, str] = {
    "awq": "octavo.quantization.awq:AwqConfig",
    "compressed-tensors": "octavo.quantization.compressed_tensors:CompressedTensorsConfig",
    "fp8": "octavo.quantization.fp8:Fp8Config",
    "gptq": "octavo.quantization.gptq:GptqConfig",
    "int8": "octavo.quantization.int8:Int8Config",
}

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
    requested: str | None, hf_quant_config: Any, platform_name: str, platform_methods: tuple[str, ...],
    online_methods: tuple[str, ...] = (),
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
    if from_ckpt is None and method not in online_methods:
        raise ValueError(
            f"--quantization (quantization) {method!r} on an unquantized checkpoint asks octavo to quantize "
            f"it at load, which the {platform_name} platform does not do for {method!r}; methods it "
            f"quantizes online: {', '.join(online_methods) or 'none'}"
            + (" (fp8 on the CPU would only be emulated: slower and less accurate than bfloat16)"
               if method == "fp8" and platform_name == "cpu" else "")
        )
    get_quant_config(method, hf_quant_config)  # unsupported settings are refused here, at load
    return method


def get_quant_config(method: str, hf_quant_config: Any):
    """The parsed ``QuantizationConfig`` of ``method`` (``hf_quant_config`` None: online)."""
    import importlib

    from octavo.quantization.base import QuantizationConfig

    module, _, cls_name = QUANTIZATION_METHODS[method].partition(":")
    cls: type[QuantizationConfig] = getattr(importlib.import_module(module), cls_name)
    cfg = None if hf_quant_config is None else (
        dict(hf_quant_config) if isinstance(hf_quant_config, dict) else dict(vars(hf_quant_config))
    )
    return cls.from_config(cfg)
