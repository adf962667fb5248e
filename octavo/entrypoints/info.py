"""What ``octavo info`` prints: versions, the resolved platform, every choice and its reason.

Keys are labels and values one-line explanations; lines starting with ``  not`` say why an
alternative (another platform, a higher-priority attention backend) was not taken.
"""

from __future__ import annotations

import platform as _py_platform


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def collect_info(
    model: str | None = None, tensor_parallel_size: int = 1, enable_expert_parallel: bool = False,
    quantization: str | None = None,
) -> dict[str, str]:
    """Everything ``octavo info`` prints, as ordered (label, explanation) pairs."""
    import torch

    from octavo import __version__
    from octavo.engine.arg_utils import EngineArgs
    from octavo.platforms import get_resolution
    from octavo.platforms.interface import PLATFORM_API_VERSION

    resolution = get_resolution()
    p = resolution.platform
    info: dict[str, str] = {
        "octavo": __version__,
        "python": _py_platform.python_version(),
        "torch": torch.__version__,
        "platform": f"{p.name} ({resolution.how})",
    }
    for alt, why in resolution.alternatives.items():
        info[f"  not {alt}"] = why
    info["platform api"] = f"{p.api_version} (octavo implements {PLATFORM_API_VERSION})"
    for k, v in p.describe().items():
        info[k] = str(v)
    dtypes = [_dtype_name(d) for d in p.supported_dtypes()]
    info["dtypes"] = ", ".join(dtypes) + f" (auto falls back to {dtypes[0]})"
    comm = p.get_communicator()
    info["communicator"] = f"{comm} [torch.distributed backend {p.get_dist_backend()}]"
    try:
        cfg = EngineArgs(
            model=model, tensor_parallel_size=tensor_parallel_size, enable_expert_parallel=enable_expert_parallel,
            quantization=quantization,
        ).create_engine_config()
    except ValueError as e:
        info["graphs"] = str(p.get_graph_capture())
        info["model"] = f"unavailable: {e}"
        info["attention"] = "priority " + ", ".join(p.attn_backend_candidates()) + " (needs a model)"
        return info
    mc, cc = cfg.model_config, cfg.cache_config
    info["graphs"] = str(p.get_graph_capture(cfg))
    info["model"] = mc.model
    info["architecture"] = mc.architecture
    info["dtype"] = _dtype_name(mc.dtype)
    info["max_model_len"] = str(mc.max_model_len)
    info["block_size"] = str(cc.block_size)
    try:
        backend, skipped = p.get_attn_backend(mc.head_size, mc.dtype, cc.kv_cache_dtype, cc.block_size)
    except ValueError as e:
        info["attention"] = f"none can run: {e}"
        return info
    describe = getattr(backend, "describe", None)
    detail = describe() if callable(describe) else (
        f"head size {mc.head_size}, {_dtype_name(mc.dtype)}, block size {cc.block_size}"
    )
    rank = p.attn_backend_candidates().index(backend.name) + 1 if backend.name in p.attn_backend_candidates() else 0
    how = f"choice {rank} of {len(p.attn_backend_candidates())}" if rank else "forced"
    if skipped:
        how += f"; fallback: {', '.join(skipped)} cannot run, see below"
    info["attention"] = f"{backend.name} ({detail}; {how})"
    for name, reasons in skipped.items():
        info[f"  not {name}"] = "; ".join(reasons)
    info.update(_moe_info(p, cfg))
    info.update(_quant_info(p, mc))
    return info


def _quant_info(p, mc) -> dict[str, str]:
    """The platform's quantization methods; for a quantized model, its method and the kernel
    each kind of its weights would run (and why the faster ones would not)."""
    from octavo.quantization import supported_methods

    online = ", ".join(getattr(p, "supported_online_quantization", ())) or "none"
    info = {"quantization methods": f"{', '.join(supported_methods(p.supported_quantization)) or 'none'} "
                                    f"(online: {online})"}
    if mc.quantization is None:
        return info
    from octavo.quantization import get_quant_config
    from octavo.quantization.kernels.select import probe_kernels

    qconfig = get_quant_config(mc.quantization, getattr(mc.hf_config, "quantization_config", None))
    info["quantization"] = qconfig.describe()
    for kind, (kernel, skipped) in probe_kernels(qconfig.kinds, dict(p.quant_kernel_priority)).items():
        info[f"quant kernel ({kind})"] = kernel
        for name, why in skipped.items():
            info[f"  not {name}"] = why
    return info


def _moe_info(p, cfg) -> dict[str, str]:
    """Experts, their placement per rank, weights per rank and the MoE kernel (MoE models)."""
    import torch

    from octavo.models.registry import MOE_ARCHITECTURES

    mc = cfg.model_config
    if mc.architecture not in MOE_ARCHITECTURES:
        return {}
    from octavo.models.moe.kernels import choose_kernel
    from octavo.models.moe.summary import moe_summary

    pc = cfg.parallel_config
    info = moe_summary(
        mc.hf_config, torch.empty((), dtype=mc.dtype).element_size(), pc.tensor_parallel_size,
        pc.enable_expert_parallel, cfg.scheduler_config.max_num_batched_tokens,
    )
    try:
        kernel, skipped = choose_kernel(p, mc.dtype)
    except ValueError as e:
        info["moe kernel"] = f"none can run: {e}"
        return info
    info["moe kernel"] = kernel(mc.dtype).describe() + f" (priority {', '.join(p.moe_backend_priority)})"
    for name, reasons in skipped.items():
        info[f"  not {name}"] = "; ".join(reasons)
    return info


def models_info() -> dict[str, str]:
    """``octavo info --models``: every architecture octavo runs and the MoE flags."""
    from octavo.models.registry import MOE_ARCHITECTURES, supported_architectures

    info = {}
    for arch in supported_architectures():
        info[arch] = "mixture of experts" if arch in MOE_ARCHITECTURES else "dense"
    info["MoE flags"] = (
        "--tensor-parallel-size N shards every expert over N ranks; --enable-expert-parallel "
        "places E/N whole experts per rank instead; OCTAVO_MOE_BACKEND forces the kernel "
        "(torch_ref, cpu_grouped, triton_grouped)"
    )
    return info


def models_table() -> list[str]:
    """``octavo info --models``: one line per registered architecture, generated from the
    registry and the model classes, then the MoE flags."""
    from octavo.models.registry import describe_models
    from octavo.quantization import QUANTIZATION_METHODS

    dense_quant = ", ".join(sorted(QUANTIZATION_METHODS)) or "none"
    rows = [("architecture", "experts", "sliding window", "tensor parallel", "quantization", "formats")]
    for m in describe_models():
        rows.append((
            m.architecture, "MoE" if m.mixture_of_experts else "dense",
            "yes" if m.sliding_window else "no", "yes" if m.tensor_parallel else "no",
            "none" if m.mixture_of_experts else dense_quant, ", ".join(m.formats),
        ))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    return [*lines, "", f"MoE flags: {models_info()['MoE flags']}"]
