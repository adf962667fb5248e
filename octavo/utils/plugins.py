"""Entry-point plugin groups and the loader of the general plugins.

``octavo.platform_plugins``: zero-argument functions returning a Platform class path when their
hardware is present (resolved by ``octavo.platforms``). ``octavo.general_plugins``: zero-argument
functions that extend octavo (e.g. ``octavo.models.registry.register_model``);
``load_general_plugins`` runs each once per process.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

logger = logging.getLogger(__name__)

PLATFORM_PLUGINS_GROUP = "octavo.platform_plugins"
GENERAL_PLUGINS_GROUP = "octavo.general_plugins"

_general_plugins_loaded = False


def entry_points(group: str) -> list[EntryPoint]:
    """Installed entry points of ``group`` (tests replace this to simulate installs)."""
    from importlib.metadata import entry_points as _installed

    return list(_installed(group=group))


def load_general_plugins() -> None:
    """Run every ``octavo.general_plugins`` entry point once per process.

    Each is a zero-argument function (typically registering model architectures); one that
    raises is logged with its traceback and skipped.
    """
    global _general_plugins_loaded
    if _general_plugins_loaded:
        return
    _general_plugins_loaded = True  # before calling: a plugin may re-enter octavo
    for ep in entry_points(GENERAL_PLUGINS_GROUP):
        try:
            ep.load()()
            logger.debug("loaded general plugin %s (%s)", ep.name, ep.value)
        except Exception:
            logger.warning("general plugin %r (%s) failed; skipping it", ep.name, ep.value, exc_info=True)


def reset_general_plugins() -> None:
    """Let ``load_general_plugins`` run again (tests)."""
    global _general_plugins_loaded
    _general_plugins_loaded = False
