"""Which layers attend through a sliding window, read from an HF config.

transformers v5 configs list ``layer_types`` (``"full_attention"`` / ``"sliding_attention"``)
for models that mix them (Gemma 2/3, Qwen2/3 with ``max_window_layers``); Mistral-style configs
give one ``sliding_window`` for every layer. A query at position p of a windowed layer sees keys
``(p - window, p]``, as transformers masks them.
"""

from __future__ import annotations

_KNOWN_TYPES = ("full_attention", "sliding_attention")


def layer_sliding_windows(hf_config) -> list[int | None]:
    """Per layer: the window in tokens, or None for full attention."""
    n = hf_config.num_hidden_layers
    window = getattr(hf_config, "sliding_window", None)
    types = getattr(hf_config, "layer_types", None)
    if types is not None:
        unknown = sorted(set(types) - set(_KNOWN_TYPES))
        if unknown:
            raise ValueError(f"config.json layer_types {unknown} are not supported (only {', '.join(_KNOWN_TYPES)})")
        if len(types) != n:
            raise ValueError(f"config.json layer_types has {len(types)} entries for {n} layers")
        if "sliding_attention" in types and not window:
            raise ValueError("config.json has sliding_attention layers but no sliding_window")
        return [int(window) if t == "sliding_attention" else None for t in types]
    if not window or getattr(hf_config, "use_sliding_window", True) is False:
        return [None] * n
    return [int(window)] * n
