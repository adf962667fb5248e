#!/usr/bin/env python3
"""Write a weightless model folder with the shape of SmolLM-135M, for benchmarks.

The folder holds a Llama ``config.json`` with SmolLM-135M's dimensions (30 layers, hidden 576,
9 query / 3 KV heads of 64, MLP 1536, vocabulary 49152, tied embeddings: ~134.5M parameters)
and a tokenizer. It has no weights: load it with ``--load-format dummy``, which fills the
parameters with small random values, so throughput is measured at a realistic shape without
downloading anything::

    python tools/make_smol_config.py --out /tmp/smol-135m
    octavo bench throughput --model /tmp/smol-135m --load-format dummy ...

With ``--random-weights`` it also writes ``model.safetensors`` with transformers' random
initialisation from a fixed seed, which every engine can load (``benchmarks/cpu_e2e_compare.py``).
With ``--full-vocab`` the tokenizer's BPE vocabulary is padded to the model's 49152 ids (see
``widen_tokenizer``), so every id a random model generates decodes to text: a server streams
a chunk per token, as with a real checkpoint (``benchmarks/bench_vllm_cpu.py``).

The tokenizer files are copied from the model shipped in the package
(``octavo/assets/default_model``); when that folder is absent (the model is not trained yet),
the deterministic test tokenizer from ``tests/fixtures`` is written instead. Either tokenizer's
ids are far below the 49152-row vocabulary: the unused embedding rows only matter for the
size of the LM head, which is the point of the shape.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_DIR = ROOT / "octavo" / "assets" / "default_model"

# SmolLM-135M (HuggingFaceTB/SmolLM-135M) dimensions.
SMOL_135M = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": True,
    "attention_bias": False,
    "mlp_bias": False,
    "dtype": "bfloat16",
}

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "generation_config.json",
)


def num_parameters(cfg: dict) -> int:
    h, i, layers = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    d = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h
    embed = cfg["vocab_size"] * h
    head = 0 if cfg["tie_word_embeddings"] else embed
    return embed + layers * per_layer + h + head


def _special_ids(model_dir: Path) -> dict[str, int]:
    """bos/eos/pad ids: from the source model's config.json, else from the tokenizer files."""
    cfg_path = model_dir / "config.json"
    if cfg_path.exists():
        src = json.loads(cfg_path.read_text())
        keys = ("bos_token_id", "eos_token_id", "pad_token_id")
        return {k: src[k] for k in keys if isinstance(src.get(k), int)}
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    names = json.loads((model_dir / "tokenizer_config.json").read_text())
    ids = {}
    for key in ("bos", "eos", "pad"):
        name = names.get(f"{key}_token")
        name = name.get("content") if isinstance(name, dict) else name
        tid = tok.token_to_id(name) if isinstance(name, str) else None
        if tid is not None:
            ids[f"{key}_token_id"] = tid
    return ids


def write_tokenizer(out: Path, source: Path | None) -> str:
    """Copy the tokenizer files into ``out``; return a one-word description of the source."""
    if source is not None and (source / "tokenizer.json").exists():
        for name in TOKENIZER_FILES:
            if (source / name).exists():
                shutil.copy2(source / name, out / name)
        return str(source)
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.checkpoints import build_tokenizer

    build_tokenizer(out)
    return "tests/fixtures (deterministic test tokenizer)"


def widen_tokenizer(out: Path, vocab_size: int) -> int:
    """Pad ``out/tokenizer.json``'s BPE vocabulary to ``vocab_size`` ids; returns how many were added.

    The new entries (ids after the last one, in a fixed order) are concatenations of two
    existing non-special ASCII tokens that are not tokens themselves. No merge rule produces
    them, so encoding any text is unchanged; each decodes to its two parts' text (whole
    characters: no incremental detokenizer holds it back). Without them an id past the
    tokenizer's vocabulary decodes to nothing, and a random model mostly generates such ids.
    """
    path = out / "tokenizer.json"
    tok = json.loads(path.read_text())
    if tok["model"].get("type") != "BPE":
        raise ValueError(f"{path}: --full-vocab pads BPE vocabularies only, not {tok['model'].get('type')}")
    vocab: dict[str, int] = tok["model"]["vocab"]
    special = {a["content"] for a in tok.get("added_tokens", [])}
    next_id = 1 + max([*vocab.values(), *(a["id"] for a in tok.get("added_tokens", []))])
    ascii_chars = {chr(c) for c in range(33, 127)} | {"\u0120", "\u010a", "\u0109"}  # byte-level: ' ', \n, \t
    base = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])
            if t not in special and set(t) <= ascii_chars]
    added = 0
    for a in base:
        for b in base:
            if next_id >= vocab_size:
                path.write_text(json.dumps(tok, ensure_ascii=False))
                return added
            if a + b not in vocab:
                vocab[a + b] = next_id
                next_id += 1
                added += 1
    raise ValueError(f"{path}: cannot pad {len(vocab)} tokens to {vocab_size}")


def write_random_weights(out: Path, seed: int = 0) -> None:
    """``model.safetensors`` with transformers' random initialisation (bf16) from a fixed seed,
    so engines that cannot fill dummy weights (HF ``generate``, vLLM) load the same model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out), dtype=torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    print(f"wrote {out}/model.safetensors: random weights, seed {seed}")


def make_smol_config(
    out: Path, tokenizer_source: Path | None = DEFAULT_MODEL_DIR, random_weights: bool = False,
    full_vocab: bool = False,
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*.safetensors"):
        stale.unlink()  # a dummy-shape folder must never pick up real weights by accident
    src = write_tokenizer(out, tokenizer_source)
    cfg = dict(SMOL_135M)
    from_source = tokenizer_source is not None and (tokenizer_source / "config.json").exists()
    cfg.update(_special_ids(tokenizer_source if from_source else out))
    if full_vocab:
        src += f", padded by {widen_tokenizer(out, cfg['vocab_size'])} ids to the model's vocabulary"
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    print(f"wrote {out}/config.json: SmolLM-135M shape, {num_parameters(cfg) / 1e6:.1f}M "
          f"parameters; tokenizer from {src}")
    if random_weights:
        write_random_weights(out)
    else:
        print("no weights: load it with --load-format dummy (or write some with --random-weights)")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder to write")
    parser.add_argument(
        "--tokenizer-from", type=Path, default=DEFAULT_MODEL_DIR,
        help="model folder whose tokenizer files are copied (default: the shipped model)",
    )
    parser.add_argument(
        "--random-weights", action="store_true",
        help="also write model.safetensors with random weights from a fixed seed (~270 MB), for "
        "benchmarks that compare engines which all load weights",
    )
    parser.add_argument(
        "--full-vocab", action="store_true",
        help="pad the tokenizer's vocabulary to the model's (every generated id decodes to text)",
    )
    args = parser.parse_args(argv)
    make_smol_config(args.out, args.tokenizer_from, args.random_weights, args.full_vocab)
    return 0


if __name__ == "__main__":
    sys.exit(main())
