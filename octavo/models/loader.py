"""Load checkpoints: HF folders (*.safetensors or pytorch_model*.bin, sharded or not) or a GGUF file.

Tensors are read one at a time (``safe_open``; ``torch.load(mmap=True, weights_only=True)``
for ``.bin``; ``GGUFReader`` for GGUF, dequantized one tensor at a time) and handed to the
parameter's ``weight_loader``, which keeps only this tensor-parallel rank's slice, so peak
host memory beyond the model is about one tensor (safetensors, GGUF) or one memory-mapped
shard (``.bin``). A progress bar counts tensors for checkpoints over 1 GiB.

Weights stream tensor by tensor straight into the model's (fused) parameters; every parameter and every fused shard must be provided exactly once, or the load
fails naming what is missing. ``load_format="dummy"`` fills parameters with small random
values instead (benchmarking without a checkpoint).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

logger = logging.getLogger(__name__)

# Checkpoints at least this large show a progress bar while loading.
PROGRESS_MIN_BYTES = 1 << 30


def _files_from_index(d: Path, index: Path) -> list[Path]:
    with open(index) as f:
        weight_map = json.load(f)["weight_map"]
    files = sorted({d / name for name in weight_map.values()})
    for f in files:
        if not f.exists():
            raise ValueError(f"checkpoint shard {str(f)!r} listed in the index is missing")
    return files


def find_safetensors(model_dir: str | os.PathLike) -> list[Path]:
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    files = _files_from_index(d, index) if index.exists() else sorted(d.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {str(d)!r}")
    return files


def find_pytorch_bins(model_dir: str | os.PathLike) -> list[Path]:
    d = Path(model_dir)
    index = d / "pytorch_model.bin.index.json"
    files = _files_from_index(d, index) if index.exists() else sorted(d.glob("pytorch_model*.bin"))
    if not files:
        raise ValueError(f"no pytorch_model*.bin files in {str(d)!r}")
    return files


def checkpoint_format(model_path: str | os.PathLike, load_format: str = "auto") -> str:
    """``safetensors``, ``pt`` or ``gguf``: what ``load_format`` asks for, or (auto) what is there."""
    p = Path(model_path)
    if load_format != "auto":
        return load_format
    if p.suffix == ".gguf":
        return "gguf"
    if any(p.glob("*.safetensors")):
        return "safetensors"
    if any(p.glob("pytorch_model*.bin")):
        return "pt"
    raise ValueError(f"no *.safetensors or pytorch_model*.bin files in {str(p)!r}")


def _iter_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def _iter_pytorch_bins(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for path in files:
        try:
            try:
                state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
            except RuntimeError as e:  # the legacy (pre-zip) format cannot be memory-mapped
                if "mmap" not in str(e):
                    raise
                state = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as e:  # pickle with code in it, or not a torch file
            raise ValueError(f"cannot load {str(path)!r} with torch.load(weights_only=True): {e}") from None
        for name in list(state):
            yield name, state.pop(name)
        del state


def iter_checkpoint(model_path: str | os.PathLike, load_format: str = "auto") -> tuple[int, Iterator[tuple[str, torch.Tensor]]]:
    """(total bytes on disk, iterator of (checkpoint name, tensor)) in the chosen format."""
    fmt = checkpoint_format(model_path, load_format)
    if fmt == "gguf":
        from octavo.models.gguf_loader import iter_gguf_tensors

        return os.path.getsize(model_path), iter_gguf_tensors(str(model_path))
    files = find_pytorch_bins(model_path) if fmt == "pt" else find_safetensors(model_path)
    size = sum(f.stat().st_size for f in files)
    return size, (_iter_pytorch_bins(files) if fmt == "pt" else _iter_safetensors(files))


def _progress(total_bytes: int, it: Iterator, desc: str) -> Iterator:
    """Wrap ``it`` in a tqdm bar (tensors) when the checkpoint is large enough to wait for."""
    if total_bytes < PROGRESS_MIN_BYTES:
        return it
    from tqdm.auto import tqdm

    return tqdm(it, desc=desc, unit=" tensors", mininterval=1.0)


@torch.no_grad()
def load_weights(model: nn.Module, model_dir: str | os.PathLike, load_format: str = "auto") -> None:
    from octavo.models.kv_scales import accept_kv_scale
    from octavo.quantization.linear import accept_tensor, finalize_all, quantized_targets

    params = dict(model.named_parameters())
    # Quantized linear layers (octavo.quantization) take their tensors themselves.
    expected = model.expected_checkpoint_targets() | quantized_targets(model)
    loaded: set[tuple[str, str | None]] = set()
    unexpected: list[str] = []
    size, tensors = iter_checkpoint(model_dir, load_format)
    # Models whose checkpoints fuse tensors octavo keeps apart (or the reverse) split them here.
    split = getattr(model, "split_checkpoint_tensor", None)
    if split is not None:
        tensors = (pair for name, tensor in tensors for pair in split(name, tensor))
    for name, tensor in _progress(size, tensors, f"Loading {Path(model_dir).name}"):
        try:
            if accept_kv_scale(model, name, tensor):
                continue
        except ValueError as e:
            raise ValueError(f"tensor {name!r}: {e}") from None
        target = model.map_checkpoint_name(name)
        if target is None:
            continue  # derivable by design (rotary inv_freq, a tied lm_head)
        pname, shard = target
        if pname not in params:
            try:
                accepted = accept_tensor(model, pname, tensor, shard)
            except ValueError as e:
                raise ValueError(f"tensor {name!r}: {e}") from None
            if accepted:
                loaded.add((pname, shard))
            else:
                unexpected.append(name)
            continue
        param = params[pname]
        # Tensor-parallel parameters slice their rank's part out of the full tensor.
        loader = getattr(param, "weight_loader", _copy_whole)
        try:
            loader(param, tensor, shard)
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
    finalize_all(model)


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
