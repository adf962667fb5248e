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
    unexpected: list[str] = []
    for path in find_safetensors(model_dir):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                target = model.map_checkpoint_name(name)
                if target is None:
                    continue  # derivable by design (rotary inv_freq, a tied lm_head)
                pname, shard = target
                if pname not in params:
                    unexpected.append(name)
                    continue
                param = params[pname]
                # Tensor-parallel parameters slice their rank's part out of the full tensor.
                loader = getattr(param, "weight_loader", _copy_whole)
                try:
                    loader(param, f.get_tensor(name), shard)
                except ValueError as e:
                    raise ValueError(f"tensor {name!r}: {e}") from None
                loaded.add((pname, shard))
    if unexpected:
        raise ValueError(
            f"checkpoint {str(model_dir)!r} has tensors octavo's {type(model).__name__} does not use "
            f"(refusing to drop them silently: a quantized or different architecture?): "
            f"{_first_names(sorted(unexpected))}"
        )
    missing = expected - loaded
    if missing:
        names = sorted(f"{p}[{s}]" if s else p for p, s in missing)
        raise ValueError(f"checkpoint {str(model_dir)!r} is missing tensors: {_first_names(names)}")


def _first_names(names: list[str], limit: int = 8) -> str:
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


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
