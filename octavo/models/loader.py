"""Load HF-format checkpoints (config.json + *.safetensors, sharded or not) from a folder.

Tensors are read one at a time with ``safe_open`` and handed to the parameter's
``weight_loader``, which keeps only this tensor-parallel rank's slice.

Weights stream tensor by tensor from ``safe_open`` straight into the model's (fused)
parameters; every parameter and every fused shard must be provided exactly once, or the load
fails naming what is missing. ``load_format="dummy"`` fills parameters with small random
values instead (benchmarking without a checkpoint).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)


def find_safetensors(model_dir: str | os.PathLike) -> list[Path]:
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.exists():
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted({d / name for name in weight_map.values()})
    else:
        files = sorted(d.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {str(d)!r}")
    for f in files:
        if not f.exists():
            raise ValueError(f"checkpoint shard {str(f)!r} listed in the index is missing")
    return files


@torch.no_grad()
def load_weights(model: nn.Module, model_dir: str | os.PathLike) -> None:
    from safetensors import safe_open

    params = dict(model.named_parameters())
    expected = model.expected_checkpoint_targets()
    loaded: set[tuple[str, str | None]] = set()
    for path in find_safetensors(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                target = model.map_checkpoint_name(name)
                if target is None:
                    continue
                pname, shard = target
                if pname not in params:
                    logger.debug("skipping checkpoint tensor %s (no matching parameter)", name)
                    continue
                param = params[pname]
                # Tensor-parallel parameters slice their rank's part out of the full tensor.
                loader = getattr(param, "weight_loader", _copy_whole)
                try:
                    loader(param, f.get_tensor(name), shard)
                except ValueError as e:
                    raise ValueError(f"tensor {name!r}: {e}") from None
                loaded.add((pname, shard))
    missing = expected - loaded
    if missing:
        names = sorted(f"{p}[{s}]" if s else p for p, s in missing)
        shown = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "")
        raise ValueError(f"checkpoint {str(model_dir)!r} is missing tensors: {shown}")


def _copy_whole(param: nn.Parameter, loaded: torch.Tensor, shard_id: str | None = None) -> None:
    if param.shape != loaded.shape:
        raise ValueError(f"has shape {tuple(loaded.shape)}, expected {tuple(param.shape)}")
    param.data.copy_(loaded)


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Small random weights (deterministic), norms at 1: shapes and speed of the real model."""
    gens: dict[torch.device, torch.Generator] = {}
    for name, p in model.named_parameters():
        if "norm" in name:
            p.data.fill_(1.0)
            continue
        gen = gens.get(p.device)
        if gen is None:
            gen = gens[p.device] = torch.Generator(device=p.device).manual_seed(seed)
        p.data.uniform_(-0.05, 0.05, generator=gen)
