#!/usr/bin/env python3
"""A layer-skip draft of a checkpoint: its first ``N`` decoder layers, the embedding, the final
norm and the LM head, with the same tokenizer (a cheap draft model for ``draft_model``
speculation when no smaller sibling checkpoint exists, e.g. for octavo's shipped model).

Example:
  python benchmarks/layer_skip_draft.py --layers 1 --out /tmp/draft
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def write_layer_skip_draft(model_dir: str | Path, layers: int, out_dir: str | Path) -> str:
    """Write the draft into ``out_dir`` (created) and return it as a string."""
    from safetensors.torch import load_file, save_file

    src, out = Path(model_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    if not 1 <= layers <= config["num_hidden_layers"]:
        raise ValueError(f"--layers must be in [1, {config['num_hidden_layers']}]; got {layers}")
    tensors = {}
    for shard in sorted(src.glob("*.safetensors")):
        for name, t in load_file(shard).items():
            m = _LAYER.match(name)
            if m is None or int(m.group(1)) < layers:
                tensors[name] = t.contiguous()
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    config["num_hidden_layers"] = layers
    for key in ("layer_types", "mlp_only_layers"):  # per-layer lists follow the cut
        if isinstance(config.get(key), list):
            config[key] = config[key][:layers]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges", "generation_config")):
            shutil.copy(f, out / f.name)
    return str(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the shipped model")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    from octavo.engine.model_files import resolve_model_path

    print(write_layer_skip_draft(resolve_model_path(args.model), args.layers, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
