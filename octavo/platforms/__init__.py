"""Platform resolution: ``current_platform`` is resolved lazily, once.

Order: ``OCTAVO_PLATFORM`` forces one by name; otherwise built-ins in order.
"""

from __future__ import annotations

import importlib
import logging
from typing import TYPE_CHECKING, Any

from octavo import envs

if TYPE_CHECKING:
    from octavo.platforms.interface import Platform

logger = logging.getLogger(__name__)

BUILTIN_PLATFORMS: dict[str, str] = {
    "cpu": "octavo.platforms.cpu.CpuPlatform",
}

_current: type[Platform] | None = None


def load_platform_class(path: str) -> type[Platform]:
    module, cls = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), cls)


def resolve_platform() -> type[Platform]:
    forced = envs.OCTAVO_PLATFORM
    if forced:
        if forced not in BUILTIN_PLATFORMS:
            raise ValueError(
                f"OCTAVO_PLATFORM={forced!r} is not a known platform; known: {sorted(BUILTIN_PLATFORMS)}"
            )
        return load_platform_class(BUILTIN_PLATFORMS[forced])
    for path in BUILTIN_PLATFORMS.values():
        cls = load_platform_class(path)
        if cls.is_available():
            return cls
    raise RuntimeError("no platform is available")


def reset_current_platform() -> None:
    """Forget the resolved platform (tests that change the environment)."""
    global _current
    _current = None


def get_current_platform() -> type[Platform]:
    global _current
    if _current is None:
        _current = resolve_platform()
        logger.debug("platform: %s", _current.name)
    return _current


class _LazyPlatform:
    """Proxy resolving the platform on first attribute access."""

    def __getattr__(self, name: str) -> Any:
        return getattr(get_current_platform(), name)

    def __repr__(self) -> str:
        return f"<current_platform {get_current_platform().name}>"


current_platform: Any = _LazyPlatform()
