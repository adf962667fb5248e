"""Entry points of the example plugin (kept import-light: no torch, no octavo at import)."""

from __future__ import annotations

PLATFORM_CLASS = "octavo_dummy_platform.platform.DummyPlatform"


def register() -> str | None:
    """``octavo.platform_plugins``: the platform class path if the hardware is present.

    A real plugin probes its driver here, cheaply and without creating a device context, and
    returns None when no device is found. The dummy's device is the host CPU: always present.
    """
    return PLATFORM_CLASS


def register_models() -> None:
    """``octavo.general_plugins``: add an architecture name served by octavo's Llama code."""
    from octavo.models.registry import register_model

    register_model("DummyLlamaForCausalLM", "octavo.models.llama.LlamaForCausalLM")
