"""Configure the ``octavo`` logger once (level from ``OCTAVO_LOGGING_LEVEL``)."""

from __future__ import annotations

import logging

_configured = False


def configure_logging() -> None:
    global _configured
    if _configured:
        return
    from octavo import envs

    logger = logging.getLogger("octavo")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
    logger.setLevel(envs.OCTAVO_LOGGING_LEVEL.upper())
    logger.propagate = False
    _configured = True
