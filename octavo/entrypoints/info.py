"""What ``octavo info`` prints: versions, the resolved platform and each of its choices."""

from __future__ import annotations

import platform as _py_platform


def collect_info(model: str | None = None) -> dict[str, str]:
    import torch

    from octavo import __version__
    from octavo.config import EngineArgs
    from octavo.platforms import current_platform

    info: dict[str, str] = {
        "octavo": __version__,
        "python": _py_platform.python_version(),
        "torch": torch.__version__,
        "platform": current_platform.name,
    }
    for k, v in current_platform.describe().items():
        info[k] = str(v)
    info["graph capture"] = current_platform.graph_capture
    info["communicator"] = current_platform.communicator
    try:
        cfg = EngineArgs(model=model).create_engine_config()
        mc, cc = cfg.model_config, cfg.cache_config
        info["model"] = mc.model
        info["architecture"] = mc.architecture
        info["dtype"] = str(mc.dtype).removeprefix("torch.")
        info["max_model_len"] = str(mc.max_model_len)
        info["block_size"] = str(cc.block_size)
        backend, skipped = current_platform.get_attn_backend(mc.head_size, mc.dtype, cc.kv_cache_dtype, cc.block_size)
        info["attention"] = backend.name
        for name, reasons in skipped.items():
            info[f"  not {name}"] = "; ".join(reasons)
    except ValueError as e:
        info["model"] = f"unavailable: {e}"
    return info
