"""Platform resolution and plugin loading. ``current_platform`` is resolved lazily, once.

Resolution order:

1. ``OCTAVO_PLATFORM`` forces a platform: a built-in name (cpu, cuda, rocm, xpu, tpu), the name
   of a ``octavo.platform_plugins`` entry point, or a qualified class path. A forced platform that
   cannot run here is an error naming the reason.
2. Otherwise every entry point in group ``octavo.platform_plugins`` is loaded and called (a
   zero-argument function returning a Platform class path when its hardware is present, else
   ``None``; an exception is logged with its traceback and the plugin counts as inactive).
   Exactly one active plugin wins; two or more is an error naming all of them.
3. Otherwise the first available built-in in the order CUDA, ROCm, XPU, TPU, CPU.

Every platform that comes from outside octavo passes ``check_api_version``. The outcome,
with why every alternative was not taken, is kept as a ``PlatformResolution`` for ``octavo info``.

The entry-point groups and the general-plugin loader live in ``octavo.utils.plugins`` (a leaf
any layer may import); they are re-exported here for plugin authors.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from octavo import envs
from octavo.utils import plugins
from octavo.utils.plugins import (
    GENERAL_PLUGINS_GROUP,
    PLATFORM_PLUGINS_GROUP,
    load_general_plugins,
    reset_general_plugins,
)

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from octavo.platforms.interface import Platform

logger = logging.getLogger(__name__)

# Resolution order of the built-ins; CPU last, it is always available.
BUILTIN_PLATFORMS: dict[str, str] = {
    "cuda": "octavo.platforms.cuda.CudaPlatform",
    "rocm": "octavo.platforms.rocm.RocmPlatform",
    "xpu": "octavo.platforms.xpu.XpuPlatform",
    "tpu": "octavo.platforms.tpu.TpuPlatform",
    "cpu": "octavo.platforms.cpu.CpuPlatform",
}


class PlatformResolutionError(ValueError):
    """No platform could be chosen (conflicting plugins, a forced platform that cannot run)."""


@dataclass(frozen=True)
class PlatformResolution:
    """The chosen platform, how it was chosen, and why each alternative was not."""

    platform: type[Platform]
    how: str
    # alternative ("cuda", "plugin foo") -> why it was not chosen
    alternatives: dict[str, str] = field(default_factory=dict)


_current: type[Platform] | None = None
_resolution: PlatformResolution | None = None


# -- loading --------------------------------------------------------------------------------
def load_platform_class(path: str) -> type[Platform]:
    """Import ``module.Class`` and check it is a Platform subclass."""
    from octavo.platforms.interface import Platform

    if "." not in path:
        raise PlatformResolutionError(f"{path!r} is not a qualified class path (module.Class)")
    module, name = path.rsplit(".", 1)
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise PlatformResolutionError(f"cannot import platform class {path!r}: {e}") from e
    if not (isinstance(cls, type) and issubclass(cls, Platform)):
        raise PlatformResolutionError(f"{path!r} is not a subclass of octavo.platforms.Platform")
    return cls


def _load_external(path: str, source: str) -> type[Platform]:
    from octavo.platforms.interface import check_api_version

    cls = load_platform_class(path)
    check_api_version(cls, source)
    return cls


def _ep_label(ep: EntryPoint) -> str:
    return f"plugin {ep.name!r} ({ep.value})"


def _probe_plugin(ep: EntryPoint) -> tuple[str | None, str]:
    """Call one platform plugin: (class path or None, what happened, for the record)."""
    try:
        fn = ep.load()
        path = fn()
    except Exception as e:
        logger.warning(
            "platform %s raised while probing; ignoring it", _ep_label(ep), exc_info=True
        )
        return None, f"raised {type(e).__name__}: {e}"
    if path is None:
        return None, "reports its hardware is not present"
    if not isinstance(path, str):
        logger.warning("platform %s returned %r, not a class path; ignoring it", _ep_label(ep), path)
        return None, f"returned {path!r}, not a class path"
    return path, f"active: {path}"


def builtin_unavailable_reasons() -> dict[str, str | None]:
    """Each built-in's ``unavailable_reason()`` (``None`` = available), in resolution order."""
    out: dict[str, str | None] = {}
    for name, path in BUILTIN_PLATFORMS.items():
        try:
            out[name] = load_platform_class(path).unavailable_reason()
        except Exception as e:  # a broken vendor stack must not hide the other platforms
            logger.warning("probing the %s platform failed", name, exc_info=True)
            out[name] = f"probe failed: {type(e).__name__}: {e}"
    return out


# -- resolution -----------------------------------------------------------------------------
def _resolve_forced(forced: str) -> PlatformResolution:
    how = f"OCTAVO_PLATFORM={forced}"
    others = {n: f"not chosen: {how}" for n in BUILTIN_PLATFORMS if n != forced}
    if forced in BUILTIN_PLATFORMS:
        cls = load_platform_class(BUILTIN_PLATFORMS[forced])
        reason = cls.unavailable_reason()
        if reason is not None:
            raise PlatformResolutionError(f"OCTAVO_PLATFORM={forced} but it cannot run here: {reason}")
        return PlatformResolution(cls, how, others)
    eps = {ep.name: ep for ep in plugins.entry_points(PLATFORM_PLUGINS_GROUP)}
    if forced in eps:
        path, what = _probe_plugin(eps[forced])
        if path is None:
            raise PlatformResolutionError(f"OCTAVO_PLATFORM={forced}: the plugin {what}")
        return PlatformResolution(_load_external(path, _ep_label(eps[forced])), how, others)
    if "." in forced:
        return PlatformResolution(_load_external(forced, how), how, others)
    raise PlatformResolutionError(
        f"OCTAVO_PLATFORM={forced!r} is not a known platform; built-ins: "
        f"{list(BUILTIN_PLATFORMS)}; installed plugins: {sorted(eps) or 'none'}; "
        "or give a qualified class path"
    )


def _resolve() -> PlatformResolution:
    forced = envs.OCTAVO_PLATFORM
    if forced:
        return _resolve_forced(forced)
    alternatives: dict[str, str] = {}
    active: list[tuple[EntryPoint, str]] = []
    for ep in plugins.entry_points(PLATFORM_PLUGINS_GROUP):
        path, what = _probe_plugin(ep)
        if path is None:
            alternatives[f"plugin {ep.name}"] = what
        else:
            active.append((ep, path))
    if len(active) > 1:
        names = ", ".join(_ep_label(ep) for ep, _ in active)
        raise PlatformResolutionError(
            f"{len(active)} platform plugins are active at once: {names}; uninstall all but one, "
            "or choose one with OCTAVO_PLATFORM=<name>"
        )
    reasons = builtin_unavailable_reasons()
    if active:
        ep, path = active[0]
        cls = _load_external(path, _ep_label(ep))
        for name, reason in reasons.items():
            alternatives[name] = (
                f"plugin {ep.name!r} is active (plugins take precedence)"
                + (f"; unavailable anyway: {reason}" if reason else "")
            )
        return PlatformResolution(cls, f"the only active {_ep_label(ep)}", alternatives)
    chosen: str | None = None
    for name, reason in reasons.items():
        if chosen is None and reason is None:
            chosen = name
        elif reason is not None:
            alternatives[name] = reason
        else:
            alternatives[name] = f"available, but {chosen} comes first (order: {', '.join(BUILTIN_PLATFORMS)})"
    if chosen is None:  # pragma: no cover - the CPU is always available
        raise PlatformResolutionError(
            "no platform is available: " + "; ".join(f"{n}: {r}" for n, r in reasons.items())
        )
    how = "first available built-in; no platform plugin active"
    return PlatformResolution(load_platform_class(BUILTIN_PLATFORMS[chosen]), how, alternatives)


def resolve_platform() -> type[Platform]:
    """Resolve a platform now, ignoring (and not touching) the cached ``current_platform``."""
    return _resolve().platform


def get_resolution() -> PlatformResolution:
    """How ``current_platform`` was chosen (resolving it if that has not happened yet)."""
    get_current_platform()
    if _resolution is None:  # set through use_platform()
        assert _current is not None
        return PlatformResolution(_current, "set by octavo.platforms.use_platform")
    return _resolution


def reset_current_platform() -> None:
    """Forget the resolved platform (tests that change the environment)."""
    global _current, _resolution
    _current = None
    _resolution = None


def get_current_platform() -> type[Platform]:
    """The platform of this process, resolved on first use and then fixed."""
    global _current, _resolution
    if _current is None:
        resolution = _resolve()
        _current, _resolution = resolution.platform, resolution
        logger.info("platform: %s (%s)", _current.name, resolution.how)
    return _current


@contextlib.contextmanager
def use_platform(platform: type[Platform]) -> Iterator[type[Platform]]:
    """Make ``platform`` the current platform inside the block, restoring the previous after.

    For tests and the conformance kit, which run engines on several platforms in one process.
    """
    global _current, _resolution
    saved = (_current, _resolution)
    _current, _resolution = platform, None
    try:
        yield platform
    finally:
        _current, _resolution = saved


class _LazyPlatform:
    """Proxy resolving the platform on first attribute access."""

    def __getattr__(self, name: str) -> Any:
        return getattr(get_current_platform(), name)

    def __repr__(self) -> str:
        return f"<current_platform {get_current_platform().name}>"


current_platform: Any = _LazyPlatform()


def __getattr__(name: str) -> Any:
    # ``from octavo.platforms import Platform`` without importing torch on ``import octavo.platforms``
    if name in ("Platform", "Choice", "PLATFORM_API_VERSION"):
        from octavo.platforms import interface

        return getattr(interface, name)
    raise AttributeError(f"module 'octavo.platforms' has no attribute {name!r}")


__all__ = [
    "BUILTIN_PLATFORMS",
    "PLATFORM_API_VERSION",
    "Choice",
    "GENERAL_PLUGINS_GROUP",
    "PLATFORM_PLUGINS_GROUP",
    "Platform",
    "PlatformResolution",
    "PlatformResolutionError",
    "current_platform",
    "get_current_platform",
    "get_resolution",
    "load_general_plugins",
    "load_platform_class",
    "reset_current_platform",
    "reset_general_plugins",
    "resolve_platform",
    "use_platform",
]
