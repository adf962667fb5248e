"""Loading a model's tokenizer: one place for the engine core, the engines and the benchmarks."""

from __future__ import annotations

import os


def load_tokenizer(path: str):
    """The tokenizer of a folder or Hub id, or the one in a GGUF file's metadata."""
    from transformers import AutoTokenizer

    if path.endswith(".gguf"):
        return AutoTokenizer.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path))
    return AutoTokenizer.from_pretrained(path)
