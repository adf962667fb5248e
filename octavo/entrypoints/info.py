"""What ``octavo info`` prints: versions, the resolved platform, every choice and its reason.

Keys are labels and values one-line explanations; lines starting with ``  not`` say why an
alternative (another platform, a higher-priority attention backend) was not taken.
"""

from __future__ import annotations

import platform as _py_platform


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def collect_info(model: str | None = None) -> dict[str, str]:
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
        cfg = EngineArgs(model=model).create_engine_config()
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
    return info
