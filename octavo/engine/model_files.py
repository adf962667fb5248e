"""Finding a checkpoint and reading what the engine needs from its files.

``resolve_model_path`` takes a local folder, a ``.gguf`` file or a Hub id (downloaded through
``octavo.models.hub``); ``load_hf_config`` refuses an unsupported architecture before transformers parses the config;
``load_sampling_defaults`` turns ``generation_config.json`` into SamplingParams defaults.
Errors name the flag a user would change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from octavo import envs
from octavo.models.registry import resolve_architecture
from octavo.sampling_params import SamplingParams

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "default_model"

# generation_config.json fields that become SamplingParams defaults (vLLM's sampling set).
# ``max_new_tokens`` is not taken: a default length could exceed what a long prompt leaves
# of the context and turn a valid request into an error; the limit stays the request's own
# (or the context).
_GENERATION_FIELDS = {
    "temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
}


def flag(name: str) -> str:
    """How an error names an ``EngineArgs`` field: the CLI flag and the keyword."""
    return f"--{name.replace('_', '-')} ({name})"


def resolve_model_path(model: str | None, revision: str | None = None, download_dir: str | None = None) -> str:
    """A local folder, a local ``.gguf`` file, or a Hub id (downloaded into the Hub cache)."""
    if model is None:
        model = envs.OCTAVO_DEFAULT_MODEL or str(DEFAULT_MODEL_DIR)
    if os.path.isdir(model):
        if not os.path.exists(os.path.join(model, "config.json")):
            raise ValueError(f"--model (model): {model!r} has no config.json")
        return model
    if model.endswith(".gguf"):
        if not os.path.isfile(model):
            raise ValueError(f"--model (model): GGUF file {model!r} does not exist")
        return model
    if os.path.exists(model) or model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise ValueError(f"--model (model): {model!r} is neither a model folder, a .gguf file nor a Hub id")
    from octavo.models.hub import download_snapshot

    return download_snapshot(model, revision=revision, download_dir=download_dir)


def resolve_tokenizer_path(
    tokenizer: str | None, model_path: str, revision: str | None, download_dir: str | None
) -> str:
    """``--tokenizer`` (a folder or a Hub id, at ``--tokenizer-revision``), else the model's."""
    if tokenizer is None:
        return model_path
    if os.path.exists(tokenizer):
        return tokenizer
    from octavo.models.hub import download_snapshot

    return download_snapshot(
        tokenizer, revision=revision, download_dir=download_dir, weights=False, flag="--tokenizer (tokenizer)"
    )


def load_hf_config(model_dir: str) -> tuple[Any, str]:
    """(transformers config, supported architecture name) of a checkpoint folder or GGUF file.

    The architecture is checked on the raw ``config.json`` first, so an unsupported model fails
    with octavo's message instead of inside transformers.
    """
    from transformers import AutoConfig

    if model_dir.endswith(".gguf"):
        from octavo.models.gguf_loader import load_gguf_config

        cfg = load_gguf_config(model_dir)
        arch, _ = resolve_architecture(cfg.architectures)
        return cfg, arch
    with open(os.path.join(model_dir, "config.json")) as f:
        raw = json.load(f)
    arch, _ = resolve_architecture(raw.get("architectures"))
    return AutoConfig.from_pretrained(model_dir), arch


def load_sampling_defaults(folder: str | None) -> dict[str, Any]:
    """The sampling fields a folder's ``generation_config.json`` sets to non-default values.

    ``{}`` when ``folder`` is None or has no such file; ``ValueError`` naming the flag and the
    file when it cannot be read or its values are not valid sampling parameters.
    """
    if folder is None:
        return {}
    path = os.path.join(folder, "generation_config.json")
    if not os.path.exists(path):
        return {}
    from transformers import GenerationConfig

    try:
        diff = GenerationConfig.from_pretrained(folder).to_diff_dict()
    except Exception as e:  # transformers raises several types for a bad file
        raise ValueError(f"{flag('generation_config')}: cannot read {path}: {e}") from None
    defaults = {ours: diff[theirs] for theirs, ours in _GENERATION_FIELDS.items() if diff.get(theirs) is not None}
    try:
        SamplingParams(**defaults)
    except ValueError as e:
        raise ValueError(f"{flag('generation_config')}: {path} sets invalid sampling defaults: {e}") from None
    return defaults
